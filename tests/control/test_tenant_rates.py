"""A tenant's create rate: set through PATCH /v1/tenants/{name}, kept in the store, refused past it with
429 ``tenant_rate_limited`` and a Retry-After from its bucket, counted per tenant, shared by replicas,
and a flood of one tenant never refusing or starving another's creates."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import pytest

from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.plane import build_replica
from corral.core.rates import Rate

from .conftest import ADMIN, Cluster


async def tenant(c: Cluster, name: str, **rate: Any) -> str:
    r = await c.http.post("/v1/tenants", json={"name": name}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    token: str = r.json()["token"]
    if rate:
        r = await c.http.patch(f"/v1/tenants/{name}", json=rate, headers=c.as_(ADMIN))
        assert r.status_code == 200, r.text
    return token


async def create(c: Cluster, token: str) -> Any:
    return await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(token))


async def test_past_its_rate_a_tenant_is_told_when_to_come_back(cluster: Cluster) -> None:
    a = await tenant(cluster, "alpha", create_rate_per_s=0.4, create_burst=3)
    b = await tenant(cluster, "beta")
    assert [(await create(cluster, a)).status_code for _ in range(3)] == [201] * 3
    refused = await create(cluster, a)
    assert refused.status_code == 429
    err = refused.json()["error"]
    assert err["code"] == "tenant_rate_limited"
    # one token at 0.4/s is 2.5 s away: whole seconds on the wire, never sooner than the bucket
    assert err["retry_after_s"] == 3 and refused.headers["Retry-After"] == "3"
    assert err["details"] == {"rate_per_s": 0.4, "burst": 3, "replicas": 1}
    assert (await create(cluster, b)).status_code == 201  # another tenant is not slowed by it
    cluster.clock.advance(2.4)
    assert (await create(cluster, a)).status_code == 429
    cluster.clock.advance(0.1)
    assert (await create(cluster, a)).status_code == 201  # exactly when the bucket refilled
    batch = await cluster.http.post(
        "/v1/sandboxes/batch", json={"spec": {"memory_mb": 256}, "count": 2}, headers=cluster.as_(a)
    )
    assert batch.status_code == 429 and batch.json()["error"]["code"] == "tenant_rate_limited"

    metrics = (await cluster.http.get("/metrics", headers=cluster.as_(ADMIN))).text
    assert 'corral_tenant_refusals_total{reason="tenant_rate_limited",tenant="alpha"} 3.0' in metrics
    doc = (await cluster.http.get("/dashboard/data.json", headers=cluster.as_(ADMIN))).json()
    assert doc["requests"]["tenant_refusals"] == {"alpha": {"tenant_rate_limited": 3}}
    # nothing of a refused create is left behind: only the five it was paid for
    listed = (await cluster.http.get("/v1/sandboxes", headers=cluster.as_(a))).json()["sandboxes"]
    assert len(listed) == 4


async def test_a_rate_is_set_left_and_cleared_through_patch(cluster: Cluster) -> None:
    await tenant(cluster, "gamma")
    patch = cluster.http.patch
    r = await patch("/v1/tenants/gamma", json={"create_rate_per_s": 5.0}, headers=cluster.as_(ADMIN))
    assert (r.json()["create_rate_per_s"], r.json()["create_burst"]) == (5.0, None)
    r = await patch("/v1/tenants/gamma", json={"max_sandboxes": 7}, headers=cluster.as_(ADMIN))
    assert (r.json()["create_rate_per_s"], r.json()["max_sandboxes"]) == (5.0, 7)  # left as it was
    assert cluster.plane.rates.share(r.json()["id"]) == Rate(5.0, 5)  # no burst named: a second's worth
    r = await patch("/v1/tenants/gamma", json={"create_rate_per_s": None}, headers=cluster.as_(ADMIN))
    assert r.json()["create_rate_per_s"] is None
    assert cluster.plane.rates.share(r.json()["id"]) is None  # the default: unbounded here
    listed = (await cluster.http.get("/v1/tenants", headers=cluster.as_(ADMIN))).json()["tenants"]
    assert {t["name"]: t["create_rate_per_s"] for t in listed}["gamma"] is None


@pytest.mark.parametrize(
    "body",
    [
        {"create_rate_per_s": 0},
        {"create_rate_per_s": -1.5},
        {"create_rate_per_s": "10"},
        {"create_rate_per_s": 1e300},
        {"create_rate_per_s": True},
        {"create_burst": 0},
        {"create_burst": 2.5},
        {"create_burst": 10**12},
        {"create_burst": "3"},
        {"create_rate": 1},
    ],
)
async def test_a_rate_that_means_nothing_is_a_422(cluster: Cluster, body: dict[str, Any]) -> None:
    await tenant(cluster, "delta")
    r = await cluster.http.patch("/v1/tenants/delta", json=body, headers=cluster.as_(ADMIN))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_request"


async def test_only_an_admin_sets_a_rate_and_only_of_a_tenant_that_exists(cluster: Cluster) -> None:
    token = await tenant(cluster, "epsilon")
    body = {"create_rate_per_s": 1e6}
    r = await cluster.http.patch("/v1/tenants/epsilon", json=body, headers=cluster.as_(token))
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    r = await cluster.http.patch("/v1/tenants/nobody", json=body, headers=cluster.as_(ADMIN))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await cluster.http.patch("/v1/tenants/epsilon", json=body, headers=cluster.as_("made-up-token-xyz"))
    assert r.status_code == 401


async def test_replicas_share_a_tenants_rate_and_read_it_from_the_store(cluster: Cluster) -> None:
    await tenant(cluster, "zeta", create_rate_per_s=10.0, create_burst=8)
    other = build_replica(
        cluster.plane.store,
        LocalAgents(),
        ControlConfig(replica_id="replica-two", default_create_rate=Rate(1.0, 1)),
        cluster.clock,
        random.Random(2),
    )
    await cluster.plane.store.renew_replica("replica-two", 15.0)
    await other.rates.refresh()  # what its reconciler does every rate_refresh_s
    zeta = await cluster.plane.store.get_tenant_by_name("zeta")
    assert zeta is not None
    assert other.rates.replicas == 2 and other.rates.share(zeta.id) == Rate(5.0, 4)
    assert other.rates.share("tn_unknown") == Rate(0.5, 1)  # a tenant it has not read: the default
    cluster.clock.advance(cluster.plane.rates.refresh_s)
    await cluster.plane.rates.refresh()
    assert cluster.plane.rates.share(zeta.id) == Rate(5.0, 4)
    # an unreachable store leaves the last rates in force
    await cluster.plane.store.close()
    cluster.clock.advance(cluster.plane.rates.refresh_s)
    await cluster.plane.rates.refresh()
    assert cluster.plane.rates.share(zeta.id) == Rate(5.0, 4)


async def test_a_flood_is_limited_while_another_tenants_creates_all_succeed(cluster: Cluster) -> None:
    """Tenant A runs 48 concurrent create-and-delete loops, tenant B one create per 100 ms (virtual)."""
    a = await tenant(cluster, "flood", create_rate_per_s=20.0, create_burst=20)
    b = await tenant(cluster, "steady")
    a_codes: list[int] = []
    a_retry_after: list[str] = []
    stop = asyncio.Event()

    async def loop() -> None:
        while not stop.is_set():
            r = await create(cluster, a)
            a_codes.append(r.status_code)
            if r.status_code == 201:
                await cluster.http.delete(f"/v1/sandboxes/{r.json()['id']}", headers=cluster.as_(a))
            else:
                assert r.json()["error"]["code"] == "tenant_rate_limited", r.text
                a_retry_after.append(r.headers["Retry-After"])
                await asyncio.sleep(0.1)  # backs off (the SDK waits the Retry-After, here far less)

    floods = [asyncio.create_task(loop()) for _ in range(48)]
    b_codes = []
    for _ in range(20):
        await asyncio.sleep(0.01)
        b_codes.append((await create(cluster, b)).status_code)
        cluster.clock.advance(0.1)
    stop.set()
    await asyncio.gather(*floods)
    assert b_codes == [201] * 20
    assert a_codes.count(429) > 0 and all(v.isdigit() and int(v) >= 1 for v in a_retry_after)
    # never more than its burst plus its rate over the 2 s of virtual time
    assert a_codes.count(201) <= 20 + 20 * 2.0 + 1


async def test_the_gate_hands_a_newcomer_the_next_slot(tmp_path: Path) -> None:
    from corral.control.fairgate import FairGate

    gate = FairGate(limit=2)
    order: list[str] = []
    release = asyncio.Event()

    async def hold(key: str) -> None:
        async with gate.slot(key):
            order.append(key)
            await release.wait()

    holders = [asyncio.create_task(hold("a")) for _ in range(2)]
    await asyncio.sleep(0)
    queued = [asyncio.create_task(hold("a")) for _ in range(50)]
    await asyncio.sleep(0)
    newcomer = asyncio.create_task(hold("b"))
    cancelled = asyncio.create_task(hold("c"))
    await asyncio.sleep(0)
    assert gate.waiting() == 52 and gate.in_flight == 2
    cancelled.cancel()
    await asyncio.sleep(0)
    assert gate.waiting("c") == 0
    release.set()
    await asyncio.gather(*holders, *queued, newcomer)
    assert order[:2] == ["a", "a"] and order.index("b") <= 3  # one turn of the crowd, not fifty
    assert order.count("a") == 52 and "c" not in order
    assert gate.in_flight == 0 and gate.waiting() == 0
