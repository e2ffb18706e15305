"""``/metrics`` names hosts, their sandbox counts and memory: it takes the admin token or a metrics
token (which reads nothing else), or is served open only where the operator said so."""

from __future__ import annotations

import httpx

from corral.api.app import create_app

from .conftest import ADMIN, Cluster


async def _tenant_token(c: Cluster) -> str:
    r = await c.http.post("/v1/tenants", json={"name": "curious"}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    return token


async def _metrics_token(c: Cluster) -> tuple[str, str]:
    r = await c.http.post("/v1/tokens/metrics", headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["role"] == "metrics" and body["tenant"] is None
    return body["id"], body["token"]


async def test_metrics_without_a_token_is_401(cluster: Cluster) -> None:
    r = await cluster.http.get("/metrics")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert "corral_" not in r.text


async def test_metrics_with_a_tenant_token_is_403(cluster: Cluster) -> None:
    r = await cluster.http.get("/metrics", headers=cluster.as_(await _tenant_token(cluster)))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert "corral_" not in r.text


async def test_metrics_with_the_admin_or_a_metrics_token_is_prometheus_text(cluster: Cluster) -> None:
    _, metrics = await _metrics_token(cluster)
    for token in (ADMIN, metrics):
        r = await cluster.http.get("/metrics", headers=cluster.as_(token))
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain")
        assert "# TYPE corral_placements_total counter" in r.text


async def test_a_metrics_token_reads_nothing_else(cluster: Cluster) -> None:
    _, metrics = await _metrics_token(cluster)
    h = cluster.as_(metrics)
    assert (await cluster.http.get("/v1/sandboxes", headers=h)).status_code == 403
    assert (await cluster.http.post("/v1/sandboxes", json={}, headers=h)).status_code == 403
    assert (await cluster.http.get("/v1/hosts", headers=h)).status_code == 403
    assert (await cluster.http.get("/v1/tokens", headers=h)).status_code == 403
    assert (await cluster.http.post("/v1/tokens/metrics", headers=h)).status_code == 403
    # The E2B API takes the same token as X-API-KEY: refused there too.
    assert (await cluster.http.get("/sandboxes", headers={"X-API-KEY": metrics})).status_code == 403


async def test_a_revoked_metrics_token_is_401(cluster: Cluster) -> None:
    token_id, metrics = await _metrics_token(cluster)
    assert (
        await cluster.http.delete(f"/v1/tokens/{token_id}", headers=cluster.as_(ADMIN))
    ).status_code == 204
    assert (await cluster.http.get("/metrics", headers=cluster.as_(metrics))).status_code == 401


async def test_metrics_open_serves_without_a_token(cluster: Cluster) -> None:
    app = create_app(cluster.plane, manage=False, metrics_open=True)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://corral") as http:
        r = await http.get("/metrics")
        assert r.status_code == 200 and "corral_placements_total" in r.text
        # Only /metrics is open.
        assert (await http.get("/v1/sandboxes")).status_code == 401
