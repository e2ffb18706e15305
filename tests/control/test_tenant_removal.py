"""DELETE /v1/tenants/{name}: the admin's alone; refused (409 ``tenant_has_sandboxes``) while any of the
tenant's sandboxes is live; then every token of it, E2B keys included, answers 401 like any unknown
token, and a tenant made again under its name starts with nothing of the removed one."""

from __future__ import annotations

from typing import Any

from .conftest import ADMIN, Cluster

KUBE = "/apis/agents.x-k8s.io/v1beta1/namespaces"


async def _tenant(c: Cluster, name: str, **quota: int) -> dict[str, Any]:
    r = await c.http.post("/v1/tenants", json={"name": name, **quota}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


async def _remove(c: Cluster, name: str, token: str = ADMIN) -> Any:
    return await c.http.delete(f"/v1/tenants/{name}", headers=c.as_(token))


async def test_only_the_admin_removes_a_tenant(cluster: Cluster) -> None:
    acme = await _tenant(cluster, "acme")
    globex = await _tenant(cluster, "globex")
    for target in ("acme", "globex", "nope"):
        r = await _remove(cluster, target, acme["token"])
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (target, r.text)
    listed = (await cluster.http.get("/v1/tenants", headers=cluster.as_(ADMIN))).json()["tenants"]
    assert {"acme", "globex"} <= {t["name"] for t in listed}
    assert (await cluster.http.get("/v1/sandboxes", headers=cluster.as_(globex["token"]))).status_code == 200


async def test_an_unknown_tenant_is_404_as_on_the_other_tenants_routes(cluster: Cluster) -> None:
    r = await _remove(cluster, "nope")
    patched = await cluster.http.patch(
        "/v1/tenants/nope", json={"max_sandboxes": 1}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == patched.status_code == 404
    assert r.json()["error"]["code"] == patched.json()["error"]["code"] == "not_found"
    assert r.json()["error"]["message"] == patched.json()["error"]["message"]
    assert (await _remove(cluster, "Not A Name")).status_code == 422


async def test_the_default_tenant_is_never_removed(cluster: Cluster) -> None:
    r = await _remove(cluster, "default")
    assert r.status_code == 403 and "admin tokens" in r.json()["error"]["message"]
    assert (await cluster.http.get("/v1/tenants", headers=cluster.as_(ADMIN))).status_code == 200


async def test_a_tenant_with_a_live_sandbox_is_refused_until_it_is_deleted(cluster: Cluster) -> None:
    acme = await _tenant(cluster, "acme")
    key = (await cluster.http.post("/v1/tenants/acme/e2b-keys", headers=cluster.as_(ADMIN))).json()["key"]
    r = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=cluster.as_(acme["token"]))
    assert r.status_code == 201, r.text
    sandbox = r.json()["id"]

    r = await _remove(cluster, "acme")
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "tenant_has_sandboxes" and error["details"] == {"live_sandboxes": 1}
    assert "delete them first" in error["message"]
    # Refused means untouched: its token still works and its sandbox still runs.
    got = await cluster.http.get(f"/v1/sandboxes/{sandbox}", headers=cluster.as_(acme["token"]))
    assert got.status_code == 200 and got.json()["state"] == "running"

    r = await cluster.http.delete(f"/v1/sandboxes/{sandbox}", headers=cluster.as_(acme["token"]))
    assert r.status_code == 204
    r = await _remove(cluster, "acme")
    assert r.status_code == 204 and r.content == b""

    # Every token of it is now unknown, on the routes of both APIs.
    for token in (acme["token"], key):
        r = await cluster.http.get("/v1/sandboxes", headers=cluster.as_(token))
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert (await cluster.http.get("/sandboxes", headers={"X-API-KEY": key})).status_code == 401
    tokens = (await cluster.http.get("/v1/tokens", headers=cluster.as_(ADMIN))).json()["tokens"]
    assert all(t["tenant"] != acme["id"] for t in tokens)
    listed = (await cluster.http.get("/v1/tenants", headers=cluster.as_(ADMIN))).json()["tenants"]
    assert "acme" not in {t["name"] for t in listed}
    assert (await _remove(cluster, "acme")).status_code == 404


async def test_a_new_tenant_of_the_same_name_starts_clean(cluster: Cluster) -> None:
    old = await _tenant(cluster, "acme", max_sandboxes=1)
    made = {**cluster.as_(old["token"]), "Idempotency-Key": "k-1"}
    r = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 256, "name": "db"}, headers=made)
    assert r.status_code == 201
    first = r.json()["id"]
    # A Kubernetes client in its namespace: the name is resolved to this tenant, here.
    assert (
        await cluster.http.get(f"{KUBE}/acme/sandboxes", headers=cluster.as_(old["token"]))
    ).status_code == 200
    assert (
        await cluster.http.delete(f"/v1/sandboxes/{first}", headers=cluster.as_(ADMIN))
    ).status_code == 204
    assert (await _remove(cluster, "acme")).status_code == 204

    new = await _tenant(cluster, "acme", max_sandboxes=1)
    assert new["id"] != old["id"]
    tokens = (await cluster.http.get("/v1/tokens", headers=cluster.as_(ADMIN))).json()["tokens"]
    assert [t["tenant"] for t in tokens if t["tenant"] in (old["id"], new["id"])] == [new["id"]]
    assert (await cluster.http.get("/v1/sandboxes", headers=cluster.as_(new["token"]))).json()[
        "sandboxes"
    ] == []
    assert await cluster.plane.store.usage(new["id"]) == await cluster.plane.store.usage("tn_nobody")
    # The removed one's Idempotency-Key and name replay nothing: a new sandbox, within the new quota.
    again = {**cluster.as_(new["token"]), "Idempotency-Key": "k-1"}
    r = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 256, "name": "db"}, headers=again)
    assert r.status_code == 201 and r.json()["id"] != first and "Idempotent-Replayed" not in r.headers
    assert r.json()["tenant"] == new["id"]
    # The namespace is the new tenant's for its own token (no replica keeps the old one under its name),
    # and the old token is unknown there too.
    ns = await cluster.http.get(f"{KUBE}/acme/sandboxes", headers=cluster.as_(new["token"]))
    assert ns.status_code == 200 and [s["metadata"]["name"] for s in ns.json()["items"]] == ["db"]
    assert (
        await cluster.http.get(f"{KUBE}/acme/sandboxes", headers=cluster.as_(old["token"]))
    ).status_code == 401
