from __future__ import annotations

import asyncio
import statistics
from collections import Counter
from pathlib import Path

import pytest

from corral.shapes.sandboxes import SandboxPage
from corral.store import SandboxState

from .conftest import ADMIN, AGENT, Cluster, make_cluster


async def create(c: Cluster, token: str = ADMIN, **body: object) -> tuple[int, dict]:  # type: ignore[type-arg]
    r = await c.http.post("/v1/sandboxes", json=body, headers=c.as_(token))
    return r.status_code, r.json()


async def test_burst_of_50_concurrent_creates_spreads(cluster: Cluster) -> None:
    results = await asyncio.gather(*(create(cluster, memory_mb=2048) for _ in range(50)))
    assert all(status == 201 for status, _ in results), results[:3]
    per_host = Counter(body["host_id"] for _, body in results)
    counts = [per_host.get(a.id, 0) for a in cluster.fleet.agents]
    assert max(counts) <= 5, counts
    assert statistics.median(counts) >= 3


async def test_created_sandbox_runs_on_its_host_and_can_exec(cluster: Cluster) -> None:
    status, sb = await create(cluster, name="web-1", metadata={"team": "a"}, ttl_seconds=600)
    assert status == 201
    assert sb["state"] == "running" and sb["name"] == "web-1" and sb["metadata"] == {"team": "a"}
    assert sb["memory_mb"] == 512 and sb["cpus"] == 1.0 and sb["expires_at"] is not None
    agent = next(a for a in cluster.fleet.agents if a.id == sb["host_id"])
    assert sb["id"] in agent.sandbox_ids()
    r = await cluster.http.post(
        f"/v1/sandboxes/{sb['id']}/exec", json={"command": ["echo", "hi"]}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 200 and r.json()["stdout"] == "hi\n" and r.json()["exit_code"] == 0
    got = await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))
    assert got.json()["id"] == sb["id"]
    r = await cluster.http.delete(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))
    assert r.status_code == 204
    assert sb["id"] not in agent.sandbox_ids()
    r = await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


async def test_fill_until_refusal_is_an_honest_503(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=3, memory_mb=8192)
    try:
        placed = 0
        while True:
            status, body = await create(c, memory_mb=2048, stateful=True)
            if status != 201:
                break
            placed += 1
            assert placed < 100
        # 3 hosts x (8192 - 2048 headroom) / 2048 stateful = 9
        assert placed == 9
        assert status == 503
        err = body["error"]
        assert err["code"] == "no_capacity"
        assert err["retry_after_s"] >= 1
        assert err["details"]["reasons"]["does_not_fit"] == 3
        assert "3 hosts" in err["message"]
        r = await c.http.post(
            "/v1/sandboxes", json={"memory_mb": 2048, "stateful": True}, headers=c.as_(ADMIN)
        )
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        # nothing leaked by the refusals: only the placed sandboxes exist
        page = await c.plane.store.list_sandboxes(limit=1000)
        assert len(page.items) == 9 and all(s.state is SandboxState.RUNNING for s in page.items)
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_reservations_end_when_heartbeats_show_the_sandboxes(cluster: Cluster) -> None:
    await asyncio.gather(*(create(cluster) for _ in range(20)))
    assert await cluster.plane.store.outstanding() != {}
    await cluster.beat()
    assert await cluster.plane.store.outstanding() == {}
    assert await cluster.plane.store.audit() == []


async def test_no_healthy_hosts_when_every_heartbeat_is_stale(cluster: Cluster) -> None:
    cluster.clock.advance(60)
    cluster.plane.view.invalidate()
    status, body = await create(cluster)
    assert status == 503 and body["error"]["code"] == "no_healthy_hosts"
    assert body["error"]["details"]["reasons"] == {"stale_heartbeat": 12}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"memory_mb": -1}, "memory_mb"),
        # No store takes a sandbox of no memory; the API refuses it first, naming the field.
        ({"memory_mb": 0}, "memory_mb"),
        ({"memory_mb": "lots"}, "memory_mb"),
        ({"cpus": 0}, "cpus"),
        ({"template": "../etc"}, "template"),
        ({"name": "Not A Name"}, "name"),
        ({"ttl_seconds": -5}, "ttl_seconds"),
        ({"surprise": 1}, "surprise"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"template": "nope"}, "template"),
    ],
)
async def test_bad_bodies_are_422_naming_the_field(cluster: Cluster, body: dict, field: str) -> None:  # type: ignore[type-arg]
    status, out = await create(cluster, **body)
    assert status == 422, out
    assert out["error"]["code"] == "invalid_request"
    assert out["error"]["details"]["field"] == field


async def test_a_refused_body_says_why_in_a_users_words(cluster: Cluster) -> None:
    status, out = await create(cluster, env={f"V{i}": "x" for i in range(5000)})
    assert status == 422, out
    assert out["error"]["message"] == "env: at most 256 entries"
    status, out = await create(cluster, surprise=1)
    assert out["error"]["message"] == "surprise: not a field of this request"


async def test_a_host_enrolled_but_never_heard_from_is_joining(cluster: Cluster) -> None:
    r = await cluster.http.post("/v1/hosts/host-new/token", headers=cluster.as_(ADMIN))
    assert r.status_code == 201, r.text
    hosts = (await cluster.http.get("/v1/hosts", headers=cluster.as_(ADMIN))).json()["hosts"]
    new = next(h for h in hosts if h["id"] == "host-new")
    assert (new["state"], new["heartbeat_age_s"]) == ("joining", None)
    assert all(h["state"] != "joining" for h in hosts if h["id"] != "host-new")
    # The dashboard's document says the same, and its view age is the oldest heartbeat heard.
    doc = (await cluster.http.get("/dashboard/data.json", headers=cluster.as_(ADMIN))).json()
    row = next(h for h in doc["hosts"] if h["id"] == "host-new")
    assert (row["state"], row["heartbeat_age_s"]) == ("joining", None)
    assert doc["fleet"]["view_age_s"] < 3600


async def test_malformed_json_is_422_not_500(cluster: Cluster) -> None:
    r = await cluster.http.post(
        "/v1/sandboxes",
        content=b"{not json",
        headers={**cluster.as_(ADMIN), "Content-Type": "application/json"},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


async def test_auth(cluster: Cluster) -> None:
    assert (await cluster.http.get("/v1/sandboxes")).status_code == 401
    r = await cluster.http.get("/v1/sandboxes", headers=cluster.as_("wrong"))
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    # an agent token heartbeats; it does not create sandboxes or read hosts
    assert (await create(cluster, token=AGENT))[0] == 403
    assert (await cluster.http.get("/v1/hosts", headers=cluster.as_(AGENT))).status_code == 403


async def test_another_tenants_sandbox_is_404(cluster: Cluster) -> None:
    r = await cluster.http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))
    assert r.status_code == 201
    acme = r.json()["token"]
    r = await cluster.http.post("/v1/tenants", json={"name": "globex"}, headers=cluster.as_(ADMIN))
    globex = r.json()["token"]
    status, sb = await create(cluster, token=acme)
    assert status == 201
    for method, path, kw in [
        ("GET", f"/v1/sandboxes/{sb['id']}", {}),
        ("DELETE", f"/v1/sandboxes/{sb['id']}", {}),
        ("POST", f"/v1/sandboxes/{sb['id']}/exec", {"json": {"command": "true"}}),
    ]:
        r = await cluster.http.request(method, path, headers=cluster.as_(globex), **kw)
        assert r.status_code == 404, (method, r.text)
    listing = await cluster.http.get("/v1/sandboxes", headers=cluster.as_(globex))
    assert listing.json() == {"sandboxes": [], "next_cursor": None}
    # the owner and an admin see it
    assert (await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(acme))).status_code == 200
    assert (
        await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))
    ).status_code == 200


async def test_quota_is_429(cluster: Cluster) -> None:
    r = await cluster.http.post(
        "/v1/tenants", json={"name": "small", "max_sandboxes": 2}, headers=cluster.as_(ADMIN)
    )
    token = r.json()["token"]
    assert (await create(cluster, token=token))[0] == 201
    assert (await create(cluster, token=token))[0] == 201
    status, body = await create(cluster, token=token)
    assert status == 429 and body["error"]["code"] == "tenant_over_quota"


async def test_quota_and_name_are_answered_before_capacity(cluster: Cluster) -> None:
    """A create that fits nowhere is still told first about its quota or its name, and leaves nothing."""
    r = await cluster.http.post(
        "/v1/tenants", json={"name": "small", "max_sandboxes": 1}, headers=cluster.as_(ADMIN)
    )
    token = r.json()["token"]
    assert (await create(cluster, token=token, name="db"))[0] == 201
    # Charged in full: more than any host admits (its total less headroom), yet no more than its total.
    huge = {"memory_mb": 32000, "stateful": True}
    status, body = await create(cluster, token=token, **huge)
    assert status == 429 and body["error"]["code"] == "tenant_over_quota"
    status, body = await create(cluster, name="x", **huge)
    assert status == 503 and body["error"]["code"] == "no_capacity"
    status, body = await create(cluster, token=token, name="db", **huge)
    assert status == 409 and body["error"]["code"] == "name_conflict"
    assert len((await cluster.plane.store.list_sandboxes(limit=100)).items) == 1
    # Only the placed one's reservation (until a heartbeat confirms it) is on the books.
    assert [p.memory_mb for p in (await cluster.plane.store.outstanding()).values()] == [512]


async def test_idempotency_key_returns_the_first_sandbox(cluster: Cluster) -> None:
    h = {**cluster.as_(ADMIN), "Idempotency-Key": "k-1"}
    a = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 1024}, headers=h)
    b = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 1024}, headers=h)
    assert a.status_code == b.status_code == 201
    assert a.json()["id"] == b.json()["id"] and b.headers.get("Idempotent-Replayed") == "true"
    c = await cluster.http.post("/v1/sandboxes", json={"memory_mb": 2048}, headers=h)
    assert c.status_code == 422 and c.json()["error"]["details"]["field"] == "Idempotency-Key"
    page = await cluster.plane.store.list_sandboxes(limit=100)
    assert len(page.items) == 1


async def test_name_conflict_is_409(cluster: Cluster) -> None:
    assert (await create(cluster, name="db"))[0] == 201
    status, body = await create(cluster, name="db")
    assert status == 409 and body["error"]["code"] == "name_conflict"


async def test_batch_is_all_or_nothing(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=2, memory_mb=8192)
    try:
        h = c.as_(ADMIN)
        # 2 hosts x 6144 admittable / 2048 stateful = 6: a batch of 7 cannot fit, and leaves nothing
        r = await c.http.post(
            "/v1/sandboxes/batch", json={"count": 7, "spec": {"memory_mb": 2048, "stateful": True}}, headers=h
        )
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_capacity"
        assert (await c.plane.store.list_sandboxes(limit=100)).items == []
        assert await c.plane.store.outstanding() == {}
        assert all(a.list() == [] for a in c.fleet.agents)
        r = await c.http.post(
            "/v1/sandboxes/batch", json={"count": 6, "spec": {"memory_mb": 2048, "stateful": True}}, headers=h
        )
        assert r.status_code == 201
        boxes = r.json()["sandboxes"]
        assert len(boxes) == 6 and Counter(b["host_id"] for b in boxes) == {"host-01": 3, "host-02": 3}
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_a_batch_s_members_start_with_its_env_and_secrets(cluster: Cluster) -> None:
    spec = {"memory_mb": 512, "env": {"PLAIN": "p"}, "secrets": {"TOKEN": "batch-secret-7c1d"}}
    r = await cluster.http.post(
        "/v1/sandboxes/batch", json={"count": 3, "spec": spec}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 201, r.text
    for box in r.json()["sandboxes"]:
        out = await cluster.http.post(
            f"/v1/sandboxes/{box['id']}/exec", json={"command": ["env"]}, headers=cluster.as_(ADMIN)
        )
        assert out.status_code == 200
        assert "PLAIN=p" in out.json()["stdout"] and "TOKEN=batch-secret-7c1d" in out.json()["stdout"]
        assert "batch-secret" not in str(box)  # delivered, never echoed


async def test_drained_host_gets_nothing(cluster: Cluster) -> None:
    r = await cluster.http.post("/v1/hosts/host-03/drain", headers=cluster.as_(ADMIN))
    assert r.status_code == 200 and r.json()["state"] == "draining"
    await cluster.beat()  # a heartbeat never undrains
    results = await asyncio.gather(*(create(cluster) for _ in range(40)))
    assert all(body["host_id"] != "host-03" for _, body in results)
    hosts = (await cluster.http.get("/v1/hosts", headers=cluster.as_(ADMIN))).json()["hosts"]
    assert {h["id"]: h["state"] for h in hosts}["host-03"] == "draining"
    assert (await cluster.http.post("/v1/hosts/nope/drain", headers=cluster.as_(ADMIN))).status_code == 404


async def test_hosts_listing_shape(cluster: Cluster) -> None:
    await create(cluster)
    hosts = (await cluster.http.get("/v1/hosts", headers=cluster.as_(ADMIN))).json()["hosts"]
    assert len(hosts) == 12
    keys = {
        "id",
        "state",
        "heartbeat_age_s",
        "cpu_total",
        "cpu_used",
        "memory_mb_total",
        "memory_mb_used",
        "memory_mb_admittable",
        "memory_admission",
        "reserved_mb",
        "sandboxes",
    }
    assert keys <= set(hosts[0])
    assert sum(h["reserved_mb"] for h in hosts) == 512


async def test_ttl_reaper_deletes_expired_sandboxes(cluster: Cluster) -> None:
    status, sb = await create(cluster, ttl_seconds=5)
    assert status == 201
    cluster.clock.advance(6)
    await cluster.plane.reconciler.tick()
    assert await cluster.plane.store.get_sandbox(sb["id"]) is None
    assert all(sb["id"] not in a.sandbox_ids() for a in cluster.fleet.agents)


async def test_dead_host_orphans_and_returning_host_reclaims(cluster: Cluster) -> None:
    _status, sb = await create(cluster)
    host = sb["host_id"]
    others = [a for a in cluster.fleet.agents if a.id != host]
    cluster.clock.advance(61)
    for a in others:
        await a.beat()
    cluster.plane.view.invalidate()
    await cluster.plane.reconciler.tick()
    r = await cluster.http.post(
        f"/v1/sandboxes/{sb['id']}/exec", json={"command": "true"}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 410 and r.json()["error"]["code"] == "sandbox_orphaned"
    got = (await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))).json()
    assert got["state"] == "orphaned" and got["host_id"] == host  # a host's death never deletes a placement
    await cluster.beat()  # the host is back, still running it
    await cluster.plane.reconciler.tick()
    got = (await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))).json()
    assert got["state"] == "running"


async def test_dead_replica_reservations_end_with_its_lease(cluster: Cluster) -> None:
    store = cluster.plane.store
    await store.renew_replica("ghost", 5)
    res = await store.reserve("host-01", memory_mb=4096, owner="ghost", ttl_s=600)
    assert res is not None
    cluster.clock.advance(6)
    await cluster.plane.reconciler.tick()
    assert await store.outstanding() == {}


async def test_metrics_are_exported(cluster: Cluster) -> None:
    await asyncio.gather(*(create(cluster) for _ in range(5)))
    cluster.clock.advance(60)
    cluster.plane.view.invalidate()
    await create(cluster)
    await cluster.beat()
    await cluster.plane.reconciler.tick()
    text = (await cluster.http.get("/metrics", headers=cluster.as_(ADMIN))).text
    for name in [
        "corral_placements_total",
        'corral_refusals_total{reason="no_healthy_hosts"}',
        "corral_host_load_max_to_median_ratio",
        "corral_host_reserved_memory_bytes",
        "corral_decision_view_age_seconds",
        "corral_create_duration_seconds",
        "corral_resident_to_committed_memory_ratio",
    ]:
        assert name in text, name


async def test_health_and_readiness(cluster: Cluster) -> None:
    assert (await cluster.http.get("/healthz")).json() == {"status": "ok"}
    assert (await cluster.http.get("/readyz")).status_code == 200
    assert (await cluster.http.get("/openapi.json")).json()["info"]["title"] == "corral"


async def test_heartbeat_route_needs_the_agent_token(cluster: Cluster) -> None:
    hb = cluster.fleet.agents[0].heartbeat().model_dump(mode="json")
    r = await cluster.http.post("/v1/agent/heartbeat", json=hb, headers=cluster.as_("nope"))
    assert r.status_code == 401
    r = await cluster.http.post("/v1/agent/heartbeat", json=hb, headers=cluster.as_(AGENT))
    assert r.status_code == 200 and r.json()["accepted"] is True


async def test_deleting_before_a_heartbeat_ends_the_reservation(cluster: Cluster) -> None:
    _, sb = await create(cluster, memory_mb=4096)
    assert await cluster.plane.store.outstanding() != {}
    assert (
        await cluster.http.delete(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))
    ).status_code == 204
    assert await cluster.plane.store.outstanding() == {}


async def test_a_sandbox_its_host_lost_is_marked_stopped_and_a_stray_is_stopped(cluster: Cluster) -> None:
    _, sb = await create(cluster)
    await cluster.beat()
    agent = next(a for a in cluster.fleet.agents if a.id == sb["host_id"])
    await agent.runtime.stop(sb["id"])  # it dies on the host behind the agent's back
    await agent.measure()
    stray = cluster.fleet.agents[0]
    from corral.agent.protocol import StartSandbox

    await stray.start(StartSandbox(id="sb-stray", memory_mb=256))  # a sandbox no record claims
    for _ in range(2):  # both must be seen twice (the lost one in two heartbeats) before anything is done
        cluster.clock.advance(0.5)
        await cluster.beat()
        await cluster.plane.reconciler._stop_strays()
    got = (await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))).json()
    assert got["state"] == "stopped"
    assert "sb-stray" not in stray.sandbox_ids()


async def test_a_refused_create_retried_with_its_key_creates_anew(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=1, memory_mb=8192)
    try:
        h = {**c.as_(ADMIN), "Idempotency-Key": "retry-me"}
        big = {"memory_mb": 8192, "stateful": True}
        r = await c.http.post("/v1/sandboxes", json=big, headers=h)
        assert r.status_code == 503
        # the key is free again: the retry is a fresh attempt, not a replay of the refusal
        r = await c.http.post("/v1/sandboxes", json=big, headers=h)
        assert r.status_code == 503 and "Idempotent-Replayed" not in r.headers
        assert (await c.plane.store.list_sandboxes(limit=10)).items == []
        ok = {**c.as_(ADMIN), "Idempotency-Key": "fits"}
        first = await c.http.post("/v1/sandboxes", json={"memory_mb": 1024}, headers=ok)
        again = await c.http.post("/v1/sandboxes", json={"memory_mb": 1024}, headers=ok)
        assert again.json()["state"] == "running" and again.json()["id"] == first.json()["id"]
        await c.http.delete(f"/v1/sandboxes/{first.json()['id']}", headers=c.as_(ADMIN))
        gone = await c.http.post("/v1/sandboxes", json={"memory_mb": 1024}, headers=ok)
        assert gone.status_code == 404
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_a_templates_pids_limit_reaches_the_runtime(cluster: Cluster) -> None:
    r = await cluster.http.post(
        "/v1/templates", json={"name": "tight", "memory_mb": 512, "pids": 64}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 201 and r.json()["pids"] == 64
    for bad in (0, 7, 1 << 23, "64"):
        r = await cluster.http.post(
            "/v1/templates", json={"name": "bad", "pids": bad}, headers=cluster.as_(ADMIN)
        )
        assert r.status_code == 422, bad
    for template, pids in (("tight", 64), ("default", 512)):
        status, sb = await create(cluster, template=template)
        assert status == 201, sb
        agent = next(a for a in cluster.fleet.agents if a.id == sb["host_id"])
        handle = next(h for h in await agent.runtime.list() if h.id == sb["id"])
        assert handle.spec.pids == pids


async def test_oom_kills_travel_from_the_agent_to_the_sandbox(cluster: Cluster) -> None:
    status, sb = await create(cluster)
    assert status == 201 and sb["oom_kills"] == 0
    agent = next(a for a in cluster.fleet.agents if a.id == sb["host_id"])
    agent._live[sb["id"]].oom_kills = 3  # what a measurement of its cgroup would have read and noted
    agent._oom_ids.add(sb["id"])
    await cluster.beat()
    got = await cluster.http.get(f"/v1/sandboxes/{sb['id']}", headers=cluster.as_(ADMIN))
    assert got.json()["oom_kills"] == 3


async def test_a_listed_sandbox_is_what_get_answers(cluster: Cluster) -> None:
    """The list builds its rows as GET does (no model pass): the same fields, the same text."""
    await create(cluster, name="web-1", metadata={"team": "a"}, ttl_seconds=600, memory_mb=512)
    await create(cluster, memory_mb=256, cpus=0.5)
    first = await cluster.http.get("/v1/sandboxes", params={"limit": 1}, headers=cluster.as_(ADMIN))
    rest = await cluster.http.get(
        "/v1/sandboxes", params={"cursor": first.json()["next_cursor"]}, headers=cluster.as_(ADMIN)
    )
    rows = first.json()["sandboxes"] + rest.json()["sandboxes"]
    assert len(rows) == 2 and rest.json()["next_cursor"] is None
    for row in rows:
        got = await cluster.http.get(f"/v1/sandboxes/{row['id']}", headers=cluster.as_(ADMIN))
        assert row == got.json()
    assert SandboxPage.model_validate(first.json()).sandboxes[0].id == rows[0]["id"]
