"""The create, get and delete routes answered in front of FastAPI give the answers the declared
FastAPI routes give, for good requests and hostile ones, and stay described in /openapi.json."""

from __future__ import annotations

import httpx
import pytest

from corral.api.app import create_app

from .conftest import ADMIN, AGENT, Cluster

JSON = {"Content-Type": "application/json"}

# (body bytes, extra headers): each must be refused with a 4xx in the error shape.
HOSTILE_CREATES: list[tuple[bytes, dict[str, str]]] = [
    (b"", {}),
    (b"not json", {}),
    (b"[]", {}),
    (b"null", {}),
    (b'{"memory_mb": "256"}', {}),
    (b'{"memory_mb": -1}', {}),
    (b'{"memory_mb": 1e300}', {}),
    (b'{"memory_mb": 99999999999999999999999999}', {}),
    (b'{"cpus": -0.5}', {}),
    (b'{"stateful": "yes"}', {}),
    (b'{"name": "../../etc"}', {}),
    (b'{"template": "x\\u0000y"}', {}),
    (b'{"metadata": {"": "x"}}', {}),
    (b'{"metadata": {"k": "a\\u0000"}}', {}),
    (b'{"env": {"A=B": "x"}}', {}),
    (b'{"surprise": 1}', {}),
    (b'{"ttl_seconds": -5}', {}),
    (b'{"template": "no-such-template"}', {}),
    (b'{"memory_mb": 256}', {"Idempotency-Key": "k" * 257}),
    (b'{"memory_mb": 1}', {}),
    (b'{"memory_mb": 256' + b"]" * 10_000, {}),
]


def _shape(r: httpx.Response) -> tuple[int, str | None, object]:
    body = r.json() if r.content else None
    if r.status_code < 400:
        return r.status_code, None, None
    err = body["error"]
    return r.status_code, err["code"], err["details"].get("field")


@pytest.fixture
async def reference(cluster: Cluster) -> httpx.AsyncClient:
    """The same control plane behind the declared FastAPI routes alone."""
    app = create_app(cluster.plane, manage=False, hot_routes=False)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://ref.test") as c:
        yield c


@pytest.mark.parametrize(("body", "headers"), HOSTILE_CREATES)
async def test_hostile_creates_are_refused_as_fastapi_refuses_them(
    cluster: Cluster, reference: httpx.AsyncClient, body: bytes, headers: dict[str, str]
) -> None:
    h = {**cluster.as_(ADMIN), **JSON, **headers}
    fast = await cluster.http.post("/v1/sandboxes", content=body, headers=h)
    ref = await reference.post("/v1/sandboxes", content=body, headers=h)
    assert 400 <= fast.status_code < 500, fast.text
    want = _shape(ref)
    if str(want[2]).isdigit():
        # FastAPI names a JSON syntax error's character offset as the field; this layer says "body".
        want = (want[0], want[1], "body")
    assert _shape(fast) == want, (fast.text, ref.text)
    assert fast.json()["error"]["message"]
    page = await cluster.plane.store.list_sandboxes(limit=10)
    assert page.items == []


@pytest.mark.parametrize("token", [None, "", "not-a-token", AGENT])
async def test_callers_without_a_user_token_are_refused_on_every_hot_route(
    cluster: Cluster, reference: httpx.AsyncClient, token: str | None
) -> None:
    h = {**JSON, **({"Authorization": f"Bearer {token}"} if token is not None else {})}
    for method, path, body in [
        ("POST", "/v1/sandboxes", b"{}"),
        ("GET", "/v1/sandboxes/sb-0", None),
        ("DELETE", "/v1/sandboxes/sb-0", None),
    ]:
        fast = await cluster.http.request(method, path, content=body, headers=h)
        ref = await reference.request(method, path, content=body, headers=h)
        assert fast.status_code in (401, 403), fast.text
        assert _shape(fast) == _shape(ref)
    assert (await cluster.plane.store.list_sandboxes(limit=10)).items == []


async def test_a_tenant_cannot_see_or_delete_another_tenants_sandbox(
    cluster: Cluster, reference: httpx.AsyncClient
) -> None:
    _, token_a = await cluster.plane.create_tenant("team-a", 10, 1 << 20)
    _, token_b = await cluster.plane.create_tenant("team-b", 10, 1 << 20)
    made = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=cluster.as_(token_a))
    assert made.status_code == 201
    sb = made.json()["id"]
    for client in (cluster.http, reference):
        assert (await client.get(f"/v1/sandboxes/{sb}", headers=cluster.as_(token_b))).status_code == 404
        assert (await client.delete(f"/v1/sandboxes/{sb}", headers=cluster.as_(token_b))).status_code == 404
    got = await cluster.http.get(f"/v1/sandboxes/{sb}", headers=cluster.as_(token_a))
    ref = await reference.get(f"/v1/sandboxes/{sb}", headers=cluster.as_(token_a))
    assert got.status_code == ref.status_code == 200 and got.json() == ref.json()
    assert (await cluster.http.delete(f"/v1/sandboxes/{sb}", headers=cluster.as_(token_a))).status_code == 204
    assert (await reference.get(f"/v1/sandboxes/{sb}", headers=cluster.as_(token_a))).status_code == 404


async def test_a_create_answers_as_the_declared_route_does(
    cluster: Cluster, reference: httpx.AsyncClient
) -> None:
    h = {**cluster.as_(ADMIN), "Idempotency-Key": "same-key"}
    spec = {"memory_mb": 512, "name": "web", "metadata": {"a": "b"}, "ttl_seconds": 60}
    fast = await cluster.http.post("/v1/sandboxes", json=spec, headers=h)
    assert fast.status_code == 201 and "idempotent-replayed" not in fast.headers
    # The declared route replays the same key: same sandbox, same body, marked replayed.
    ref = await reference.post("/v1/sandboxes", json=spec, headers=h)
    assert ref.status_code == 201 and ref.headers["Idempotent-Replayed"] == "true"
    assert ref.json() == fast.json()
    again = await cluster.http.post("/v1/sandboxes", json=spec, headers=h)
    assert again.headers["Idempotent-Replayed"] == "true" and again.json() == fast.json()
    assert fast.headers["x-request-id"]


async def test_the_hot_routes_stay_described_in_openapi(cluster: Cluster) -> None:
    doc = (await cluster.http.get("/openapi.json")).json()
    create = doc["paths"]["/v1/sandboxes"]["post"]
    assert create["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("SandboxSpecBody")
    assert create["responses"]["201"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "SandboxRecord"
    )
    assert any(p["name"] == "Idempotency-Key" for p in create["parameters"])
    one = doc["paths"]["/v1/sandboxes/{sandbox_id}"]
    assert {"get", "delete"} <= set(one)
