"""Warm pools end to end on the sim runtime: intent, spreading, the claim, exclusivity, eviction,
a crash between hand-over and record, and the tenant's view."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest

from corral.agent.protocol import ROLE_CLAIMED, ROLE_WARM, ClaimWarm, WarmTarget
from corral.core.warm import Slot, spread
from corral.runtime.sim import SimRuntime
from corral.store import SandboxRecord

from .conftest import ADMIN, Cluster, make_cluster


async def settle(c: Cluster, rounds: int = 50) -> None:
    """Leader round, heartbeats (targets reach the agents), refills, heartbeats: until nothing moves."""
    await c.plane.reconciler.tick()
    await c.beat()
    for _ in range(rounds):
        began = sum(a.replenish() for a in c.fleet.agents)
        for _ in range(5):
            await asyncio.sleep(0)
        if not began and not any(a.warm.starting_count(t) for a in c.fleet.agents for t in a.warm.targets):
            break
    await c.beat()


async def tenant(c: Cluster, name: str, **quota: int) -> str:
    r = await c.http.post("/v1/tenants", json={"name": name, **quota}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    return str(r.json()["token"])


async def pool(c: Cluster, size: int, max_per_host: int | None = None, template: str = "py") -> dict:  # type: ignore[type-arg]
    r = await c.http.post("/v1/templates", json={"name": template, "memory_mb": 512}, headers=c.as_(ADMIN))
    assert r.status_code in (201, 409)
    body: dict[str, object] = {"template": template, "size": size}
    if max_per_host is not None:
        body["max_per_host"] = max_per_host
    r = await c.http.post("/v1/pools", json=body, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    await settle(c)
    r = await c.http.get(f"/v1/pools/{template}", headers=c.as_(ADMIN))
    return r.json()  # type: ignore[no-any-return]


def warm_total(c: Cluster, template: str = "py") -> int:
    return sum(a.warm.ready_count(template) for a in c.fleet.agents)


def runtime_total(c: Cluster) -> int:
    return sum(len(a.runtime.state.sandboxes) for a in c.fleet.agents if isinstance(a.runtime, SimRuntime))


async def test_pool_fills_spread_and_a_create_claims_one(cluster: Cluster) -> None:
    c = cluster
    p = await pool(c, 24, max_per_host=3)
    assert p["size"] == 24 and p["ready"] == 24 and p["starting"] == 0
    assert sum(h["target"] for h in p["per_host"].values()) == 24
    assert max(h["target"] for h in p["per_host"].values()) <= 3
    token = await tenant(c, "acme")
    r = await c.http.post(
        "/v1/sandboxes", json={"template": "py", "env": {"GREETING": "hi"}}, headers=c.as_(token)
    )
    assert r.status_code == 201, r.text
    sb = r.json()
    assert sb["warm"] is True and sb["state"] == "running" and sb["template"] == "py"
    # Durable before the response: readable, and exec runs with the create's env at once.
    r = await c.http.get(f"/v1/sandboxes/{sb['id']}", headers=c.as_(token))
    assert r.status_code == 200 and r.json()["warm"] is True
    r = await c.http.post(f"/v1/sandboxes/{sb['id']}/exec", json={"command": ["env"]}, headers=c.as_(token))
    assert r.status_code == 200 and "GREETING=hi" in r.json()["stdout"]
    assert warm_total(c) == 23
    # The tenant's quota counts it; its listing shows it and nothing warm that is unclaimed.
    r = await c.http.get("/v1/sandboxes", headers=c.as_(token))
    assert [s["id"] for s in r.json()["sandboxes"]] == [sb["id"]]
    # An override of what the warm sandboxes were admitted with is a cold create.
    r = await c.http.post("/v1/sandboxes", json={"template": "py", "memory_mb": 1024}, headers=c.as_(token))
    assert r.status_code == 201 and r.json()["warm"] is False
    await settle(c)
    r = await c.http.get("/v1/pools", headers=c.as_(ADMIN))
    (listed,) = r.json()["pools"]
    assert listed["ready"] == 24 and listed["hits"] == 1 and listed["misses"] == 1
    # Deleting it works from the tenant's side like any sandbox.
    r = await c.http.delete(f"/v1/sandboxes/{sb['id']}", headers=c.as_(token))
    assert r.status_code == 204


async def test_unclaimed_warm_sandboxes_are_invisible_to_tenants(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 6)
    token = await tenant(c, "hostile")
    warm_id = next(i for a in c.fleet.agents for i in a.warm.ready_ids())
    for method, path in (
        ("GET", f"/v1/sandboxes/{warm_id}"),
        ("DELETE", f"/v1/sandboxes/{warm_id}"),
        ("POST", f"/v1/sandboxes/{warm_id}/exec"),
    ):
        r = await c.http.request(method, path, json={"command": ["true"]}, headers=c.as_(token))
        assert r.status_code == 404, (method, r.text)
    r = await c.http.get("/v1/sandboxes", headers=c.as_(token))
    assert r.json()["sandboxes"] == []
    # Pools are an operator's business.
    for method, path in (("GET", "/v1/pools"), ("POST", "/v1/pools"), ("DELETE", "/v1/pools/py")):
        r = await c.http.request(method, path, json={"template": "py", "size": 1}, headers=c.as_(token))
        assert r.status_code == 403
    assert warm_total(c) == 6


async def test_over_quota_tenant_cannot_drain_a_pool(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 6)
    token = await tenant(c, "small", max_sandboxes=1)
    r = await c.http.post("/v1/sandboxes", json={"template": "py", "name": "one"}, headers=c.as_(token))
    assert r.status_code == 201 and r.json()["warm"] is True
    for _ in range(10):
        r = await c.http.post("/v1/sandboxes", json={"template": "py"}, headers=c.as_(token))
        assert r.status_code == 429
    assert warm_total(c) == 5


async def test_bad_pool_bodies_are_4xx(cluster: Cluster) -> None:
    c = cluster
    h = c.as_(ADMIN)
    for body in (
        {"template": "nope", "size": 1},
        {"template": "default", "size": -1},
        {"template": "../x", "size": 1},
        {"template": "default", "size": "3"},
        {"template": "default", "size": 1, "max_per_host": 0},
    ):
        r = await c.http.post("/v1/pools", json=body, headers=h)
        assert r.status_code == 422, (body, r.text)
    assert (
        await c.http.post("/v1/pools", json={"template": "default", "size": 1}, headers=h)
    ).status_code == 201
    assert (
        await c.http.post("/v1/pools", json={"template": "default", "size": 1}, headers=h)
    ).status_code == 409
    assert (await c.http.patch("/v1/pools/nope", json={"size": 1}, headers=h)).status_code == 404
    assert (await c.http.delete("/v1/pools/nope", headers=h)).status_code == 404
    assert (await c.http.get("/v1/pools/nope", headers=h)).status_code == 404


async def test_exclusivity_200_concurrent_creates_against_50_warm(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 50)
    assert warm_total(c) == 50
    before = runtime_total(c)
    results = await asyncio.gather(
        *(c.http.post("/v1/sandboxes", json={"template": "py"}, headers=c.as_(ADMIN)) for _ in range(200))
    )
    ok = [r.json() for r in results if r.status_code == 201]
    refused = [r for r in results if r.status_code != 201]
    assert all(r.status_code == 503 for r in refused)
    ids = [s["id"] for s in ok]
    assert len(set(ids)) == len(ids)  # no sandbox handed to two creates
    warm = [s for s in ok if s["warm"]]
    assert len(warm) <= 50 and len(warm) + len([s for s in ok if not s["warm"]]) + len(refused) == 200
    assert len(warm) >= 45  # the pool was full and the view fresh: nearly every warm one is used
    # Counts add up on the hosts: every runtime sandbox is a recorded one or a still-warm one.
    assert warm_total(c) == 50 - len(warm)
    assert runtime_total(c) == before + len(ok) - len(warm)
    running = {i for a in c.fleet.agents for i in a.runtime.state.sandboxes}  # type: ignore[attr-defined]
    ready = {i for a in c.fleet.agents for i in a.warm.ready_ids()}
    assert running == set(ids) | ready
    page = await c.plane.store.list_sandboxes(limit=1000)
    assert {s.id for s in page.items} == set(ids)
    assert await c.plane.store.audit() == []


async def test_crash_between_hand_over_and_record_is_reconciled(cluster: Cluster) -> None:
    """The replica dies after the agent handed a sandbox over and before the record was written
    (injected in-process: the claim is made on the agent and the record write never happens)."""
    c = cluster
    await pool(c, 4)
    agent = next(a for a in c.fleet.agents if a.warm.ready_count("py"))
    info = agent.claim("py", ClaimWarm(env={"SECRET": "tenant-env"}))
    assert agent.warm.role(info.id) == ROLE_CLAIMED
    await c.beat()
    host = await c.plane.store.get_host(agent.id)
    assert host is not None and info.id in await c.plane.store.listed(agent.id, [info.id])  # not as warm
    # Warm ones are never strays: two sweeps leave them; the unrecorded claimed one is stopped.
    await c.plane.reconciler._stop_strays()
    await c.beat()
    await c.plane.reconciler._stop_strays()
    await asyncio.sleep(0)
    assert info.id not in agent.runtime.state.sandboxes  # type: ignore[attr-defined]
    assert info.id not in {i for a in c.fleet.agents for i in a.warm.ready_ids()}  # never back to a pool
    await settle(c)
    assert warm_total(c) == 4  # the pool refills; the others were never touched
    assert (await c.plane.store.list_sandboxes(limit=10)).items == []


async def test_a_recorded_claim_survives_the_sweeps(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 4)
    r = await c.http.post("/v1/sandboxes", json={"template": "py"}, headers=c.as_(ADMIN))
    sid = r.json()["id"]
    for _ in range(3):
        await c.beat()
        await c.plane.reconciler._stop_strays()
    assert any(sid in a.runtime.state.sandboxes for a in c.fleet.agents)  # type: ignore[attr-defined]
    assert warm_total(c) == 3


async def test_resize_up_and_down_and_delete(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 12)
    assert warm_total(c) == 12
    r = await c.http.patch("/v1/pools/py", json={"size": 30}, headers=c.as_(ADMIN))
    assert r.status_code == 200 and r.json()["size"] == 30
    await settle(c)
    assert warm_total(c) == 30
    claimed = (await c.http.post("/v1/sandboxes", json={"template": "py"}, headers=c.as_(ADMIN))).json()
    assert claimed["warm"]
    await c.http.patch("/v1/pools/py", json={"size": 5}, headers=c.as_(ADMIN))
    await settle(c)
    await settle(c)
    assert warm_total(c) == 5
    r = await c.http.delete("/v1/pools/py", headers=c.as_(ADMIN))
    assert r.status_code == 204
    await settle(c)
    await settle(c)
    assert warm_total(c) == 0
    running = {i for a in c.fleet.agents for i in a.runtime.state.sandboxes}  # type: ignore[attr-defined]
    assert running == {claimed["id"]}  # the claimed one stays


async def test_a_draining_host_gives_its_targets_to_others(cluster: Cluster) -> None:
    c = cluster
    p = await pool(c, 24, max_per_host=4)
    victim = next(iter(p["per_host"]))
    r = await c.http.post(f"/v1/hosts/{victim}/drain", headers=c.as_(ADMIN))
    assert r.status_code == 200
    await settle(c)
    await settle(c)
    p = (await c.http.get("/v1/pools/py", headers=c.as_(ADMIN))).json()
    assert victim not in p["per_host"] or p["per_host"][victim]["target"] == 0
    assert sum(h["target"] for h in p["per_host"].values()) == 24
    assert p["ready"] == 24


async def test_a_real_create_evicts_warm_sandboxes_and_is_never_refused_for_them(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=2, memory_mb=8192)
    try:
        # Headroom is 2 GiB: 6 GiB admittable per host, all of it warm (stateful: charged in full).
        r = await c.http.post(
            "/v1/templates", json={"name": "big", "memory_mb": 1024, "stateful": True}, headers=c.as_(ADMIN)
        )
        assert r.status_code == 201
        await c.http.post("/v1/pools", json={"template": "big", "size": 12}, headers=c.as_(ADMIN))
        await settle(c)
        assert warm_total(c, "big") == 12
        for a in c.fleet.agents:
            assert a.admittable_mb() < 1024  # full of warm sandboxes
        created = []
        for _ in range(10):
            r = await c.http.post(
                "/v1/sandboxes", json={"template": "big", "memory_mb": 1000}, headers=c.as_(ADMIN)
            )
            assert r.status_code == 201, r.text
            created.append(r.json())
            await c.advance(0.5)  # a new read: this replica's own claims retire
        assert not any(s["warm"] for s in created)
        assert sum(a.warm.stats.evictions for a in c.fleet.agents) >= 10
        assert warm_total(c, "big") <= 2
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_no_over_create_when_starts_are_slow(cluster: Cluster) -> None:
    c = cluster
    agent = c.fleet.agents[0]
    gate = asyncio.Event()

    async def slow_sleep(_s: float) -> None:
        await gate.wait()

    rt = agent.runtime
    assert isinstance(rt, SimRuntime)
    rt.start_latency_s, rt._sleep = 1.0, slow_sleep
    agent.set_warm_targets([WarmTarget(template="py", target=3, memory_mb=512)])
    peak = 0
    for _ in range(100):  # many refill rounds while no start finishes
        agent.replenish()
        await asyncio.sleep(0)
        held = agent.warm.ready_count("py") + agent.warm.starting_count("py")
        peak = max(peak, held, len(rt.state.sandboxes))
    assert peak <= 3
    # Starts never take the last slots from real creates.
    assert agent.limiter.in_flight <= agent.keeper.max_in_flight
    gate.set()
    for _ in range(20):
        await asyncio.sleep(0)
        agent.replenish()
    assert agent.warm.ready_count("py") == 3 and len(rt.state.sandboxes) == 3
    # A lower target is met by stopping ready ones.
    agent.set_warm_targets([WarmTarget(template="py", target=1, memory_mb=512)])
    agent.replenish()
    for _ in range(10):
        await asyncio.sleep(0)
    assert agent.warm.ready_count("py") == 1 and len(rt.state.sandboxes) == 1


async def test_heartbeat_roles_and_counts(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 12)
    agent = next(a for a in c.fleet.agents if a.warm.ready_count("py"))
    changes = agent.heartbeat()  # the listing was acknowledged: changes only, and warm ones are none
    assert changes.base is not None and not changes.added and not changes.sandbox_ids
    agent.acknowledge(changes, None)  # no reply: the next heartbeat is the whole set
    hb = agent.heartbeat()
    assert hb.base is None and set(hb.roles.values()) == {ROLE_WARM}
    assert hb.warm["py"].ready == agent.warm.ready_count("py")
    assert not hb.owned_ids()
    host = await c.plane.store.get_host(agent.id)
    assert host is not None and host.warm["py"][0] == agent.warm.ready_count("py") and not host.sandbox_count


def test_spread_is_level_respects_caps_and_keeps_what_it_has() -> None:
    rng = random.Random(3)
    slots = [Slot(f"h{i}", 10_000) for i in range(12)]
    out = spread(100, None, slots, {}, 512, rng)
    assert sum(out.values()) == 100 and max(out.values()) - min(out.values()) <= 1
    capped = spread(100, 5, slots, {}, 512, rng)
    assert sum(capped.values()) == 60 and max(capped.values()) == 5
    # Stable: the same inputs with current targets change nothing.
    assert spread(100, None, slots, out, 512, rng) == out
    # A host that leaves gives its share to the others; one that joins takes a share.
    fewer = spread(100, None, slots[1:], out, 512, rng)
    assert "h0" not in fewer and sum(fewer.values()) == 100
    more = spread(100, None, [*slots, Slot("new", 10_000)], out, 512, rng)
    assert more.get("new", 0) >= 7 and max(more.values()) - min(more.values()) <= 1
    moved = sum(abs(more.get(h, 0) - out.get(h, 0)) for h in set(more) | set(out))
    assert moved <= 2 * more["new"]
    # No room, no target: the pool stays short rather than overfilling a host.
    tight = spread(10, None, [Slot("a", 1024), Slot("b", 0)], {}, 512, rng)
    assert tight == {"a": 2}


@pytest.mark.parametrize("n", [1])
async def test_a_record_refused_after_hand_over_stops_the_sandbox(cluster: Cluster, n: int) -> None:
    c = cluster
    await pool(c, 4)
    token = await tenant(c, "named")
    r = await c.http.post("/v1/sandboxes", json={"template": "py", "name": "taken"}, headers=c.as_(token))
    assert r.status_code == 201
    # Same name again: refused before any warm sandbox is taken.
    r = await c.http.post("/v1/sandboxes", json={"template": "py", "name": "taken"}, headers=c.as_(token))
    assert r.status_code == 409
    assert warm_total(c) == 3
    assert Counter(s.warm for s in (await c.plane.store.list_sandboxes(limit=10)).items) == Counter({True: n})
    assert isinstance((await c.plane.store.list_sandboxes(limit=10)).items[0], SandboxRecord)


async def test_warm_metrics_are_exported(cluster: Cluster) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from corral.agent.metrics import AgentCollector

    c = cluster
    await pool(c, 12)
    await c.http.post("/v1/sandboxes", json={"template": "py"}, headers=c.as_(ADMIN))
    await c.http.post("/v1/sandboxes", json={"template": "py", "cpus": 2}, headers=c.as_(ADMIN))
    text = (await c.http.get("/metrics", headers=c.as_(ADMIN))).text
    assert 'corral_warm_hits_total{template="py"} 1.0' in text
    assert 'corral_warm_misses_total{reason="override",template="py"} 1.0' in text
    assert "corral_warm_claim_seconds_count 1.0" in text
    registry = CollectorRegistry()
    registry.register(AgentCollector(c.fleet.agents))
    agents = generate_latest(registry).decode()
    assert "corral_agent_warm_claims_total" in agents and "corral_agent_warm_claim_seconds_bucket" in agents
    ready = sum(
        float(line.rsplit(" ", 1)[1])
        for line in agents.splitlines()
        if line.startswith("corral_agent_warm_sandboxes{") and 'state="ready"' in line
    )
    assert ready == 11
    assert sum(a.warm.stats.replenish_starts for a in c.fleet.agents) == 12


async def test_a_retried_create_with_its_key_takes_no_second_warm_sandbox(cluster: Cluster) -> None:
    c = cluster
    await pool(c, 6)
    token = await tenant(c, "retry")
    headers = {**c.as_(token), "Idempotency-Key": "k-1"}
    first = await c.http.post("/v1/sandboxes", json={"template": "py", "env": {"A": "1"}}, headers=headers)
    assert first.status_code == 201 and first.json()["warm"]
    for _ in range(3):
        again = await c.http.post(
            "/v1/sandboxes", json={"template": "py", "env": {"A": "1"}}, headers=headers
        )
        assert again.status_code == 201 and again.json()["id"] == first.json()["id"]
        assert again.headers["Idempotent-Replayed"] == "true"
    other = await c.http.post("/v1/sandboxes", json={"template": "py", "env": {"A": "2"}}, headers=headers)
    assert other.status_code == 422  # the same key with another body
    assert warm_total(c) == 5
    assert (await c.plane.store.usage((await c.plane.store.get_tenant_by_name("retry")).id)).sandboxes == 1  # type: ignore[union-attr]


def test_no_pool_input_produces_a_500(tmp_path: Path) -> None:
    import json

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    values = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20)
    bodies = st.dictionaries(st.sampled_from(["template", "size", "max_per_host", "x"]), values, max_size=4)
    paths = st.sampled_from(
        ["/v1/pools", "/v1/pools/py", "/v1/pools/%00", "/v1/pools/nope", "/v1/warm/py/claim"]
    )
    methods = st.sampled_from(["GET", "POST", "PATCH", "DELETE", "PUT"])
    seen: list[int] = []

    async def scenario() -> None:
        c = await make_cluster(tmp_path, hosts=2)
        try:
            await c.http.post("/v1/templates", json={"name": "py", "memory_mb": 256}, headers=c.as_(ADMIN))

            @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
            @given(method=methods, path=paths, body=bodies)
            def probe(method: str, path: str, body: dict) -> None:  # type: ignore[type-arg]
                content = json.dumps(body, allow_nan=True).encode()
                headers = {**c.as_(ADMIN), "Content-Type": "application/json"}
                r = asyncio.run_coroutine_threadsafe(
                    c.http.request(method, path, content=content, headers=headers), loop
                ).result(30)
                seen.append(r.status_code)
                assert r.status_code < 500, (method, path, body, r.status_code, r.text)
                if r.status_code >= 400:
                    assert isinstance(r.json()["error"]["code"], str)

            await asyncio.to_thread(probe)
        finally:
            await c.http.aclose()
            await c.plane.stop()
            await c.plane.store.close()

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()
    assert len(seen) >= 100 and 422 in seen


def test_plan_shares_room_between_pools_and_skips_hosts_that_cannot_run_them() -> None:
    from corral.control.pools import plan
    from corral.core import AdmissionMode, AdmissionPolicy, HostState
    from corral.store import HostRecord, PoolRecord, TemplateRecord

    def host(h: str, admittable: int, **kw: object) -> HostRecord:
        base: dict[str, object] = {
            "id": h,
            "heartbeat_at": 100.0,
            "cpu_total": 16.0,
            "cpu_used": 0.0,
            "memory_mb_total": 8192,
            "memory_mb_used": 0,
            "memory_mb_admittable": admittable,
            "memory_admission": AdmissionMode.COMMITTED,
            "templates": None,
            "runtime": "sim",
            "gpu": None,
            "role": "worker",
            "state": HostState.READY,
            "stream_restore": False,
            "seq": 1,
            "registered_at": 0.0,
            "address": "",
            "reserved_mb": 0,
            "reserved_cpu": 0.0,
        }
        base.update(kw)
        return HostRecord(**base)  # type: ignore[arg-type]

    hosts = [
        host("a", 2048),
        host("b", 2048, reserved_mb=1024),  # half its room is promised to creates in flight
        host("stale", 8192, heartbeat_at=0.0),
        host("drain", 8192, state=HostState.DRAINING),
        host("other", 8192, templates=frozenset({"go"})),
    ]
    templates = {t: TemplateRecord(t, cpus=1, memory_mb=512) for t in ("py", "rb")}
    pools = [PoolRecord("py", size=4), PoolRecord("rb", size=4)]
    out = plan(pools, templates, hosts, 101.0, 10.0, AdmissionPolicy(), random.Random(1))
    # 4 + 2 places of 512 MiB on the two hosts that may take them: the first pool fills first.
    assert sum(out["py"].values()) == 4 and set(out["py"]) <= {"a", "b"}
    assert sum(out["rb"].values()) == 2 and set(out["rb"]) <= {"a", "b"}
    used = {h: out["py"].get(h, 0) + out["rb"].get(h, 0) for h in ("a", "b")}
    assert used == {"a": 4, "b": 2}
    assert plan(
        [PoolRecord("gone", size=3)], templates, hosts, 101.0, 10.0, AdmissionPolicy(), random.Random(1)
    ) == {"gone": {}}
