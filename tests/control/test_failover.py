"""Failover on an injected clock, counted in reconcile ticks: a host silent past dead_after loses its
recreate-policy sandboxes to other hosts (same id, a new epoch, env and secrets restored from the
sealed spec) and its orphan-policy ones to ``orphaned``; when it returns, its copies of the recreated
ones are stopped by its next heartbeat's reply and its orphans are reclaimed."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent.errors import AgentConflict
from corral.agent.protocol import ExecRequest
from corral.store import SandboxRecord, SandboxState

from .conftest import ADMIN, Cluster, make_cluster

CANARY = "canary-secret-4f1b9e27"
H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
async def small(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = await make_cluster(tmp_path, hosts=4, memory_mb=8192)
    try:
        yield c
    finally:
        await c.close()


async def beat_all_but(c: Cluster, silent: str) -> None:
    for a in c.fleet.agents:
        if a.id != silent:
            await a.beat()
    c.plane.view.invalidate()


def agent(c: Cluster, host_id: str) -> Any:
    return next(a for a in c.fleet.agents if a.id == host_id)


async def make(c: Cluster, **body: Any) -> dict[str, Any]:
    r = await c.http.post("/v1/sandboxes", json=body, headers=H)
    assert r.status_code == 201, r.text
    out: dict[str, Any] = r.json()
    return out


async def on_one_host(c: Cluster, n: int, **body: Any) -> tuple[str, list[dict[str, Any]]]:
    """Create until ``n`` sandboxes of ``body`` share one host; delete the rest."""
    made: list[dict[str, Any]] = []
    while True:
        made.append(await make(c, **body))
        by_host: dict[str, list[dict[str, Any]]] = {}
        for s in made:
            by_host.setdefault(s["host_id"], []).append(s)
        host, group = max(by_host.items(), key=lambda kv: len(kv[1]))
        if len(group) >= n:
            for s in made:
                if s not in group[:n]:
                    assert (await c.http.delete(f"/v1/sandboxes/{s['id']}", headers=H)).status_code == 204
            return host, group[:n]


async def on_host(c: Cluster, host: str, **body: Any) -> dict[str, Any]:
    """Create sandboxes of ``body`` until one lands on ``host``; delete the others."""
    while True:
        s = await make(c, **body)
        if s["host_id"] == host:
            return s
        assert (await c.http.delete(f"/v1/sandboxes/{s['id']}", headers=H)).status_code == 204


async def get(c: Cluster, sid: str) -> dict[str, Any]:
    r = await c.http.get(f"/v1/sandboxes/{sid}", headers=H)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


async def routable_hosts(c: Cluster, sid: str) -> set[str]:
    """Hosts that would answer a call about ``sid`` at the epoch the control plane routes to."""
    rec = await c.plane.store.get_sandbox(sid)
    assert rec is not None
    if rec.state is not SandboxState.RUNNING:
        return set()
    out = set()
    for a in c.fleet.agents:
        if sid in a.sandbox_ids():
            try:
                a._check_epoch(sid, rec.epoch)
            except AgentConflict:
                continue
            if a.id == rec.host_id:
                out.add(a.id)
    # Any host other than the record's could only be reached through a route the plane no longer has.
    return out


def record_starts(c: Cluster) -> list[str]:
    """The sandboxes whose fresh copies the leader started their template's start command for
    (readiness.py), as it does."""
    started: list[str] = []
    run_start = c.plane.failover.started
    assert run_start is not None

    async def start_command(rec: SandboxRecord) -> object:
        started.append(rec.id)
        return await run_start(rec)

    c.plane.failover.started = start_command
    return started


async def test_a_dead_host_s_sandboxes_are_recreated_or_orphaned_and_fenced_when_it_returns(
    small: Cluster, tmp_path: Path
) -> None:
    c = small
    body = {"failover": "recreate", "env": {"PLAIN": "p"}, "secrets": {"TOKEN": CANARY}, "memory_mb": 512}
    dead, recreate = await on_one_host(c, 3, **body)
    orphan = [await on_host(c, dead, memory_mb=512) for _ in range(2)]
    assert all(s["failover"] == "recreate" and s["epoch"] == 0 for s in recreate)
    assert all(s["failover"] == "orphan" for s in orphan)

    # The host goes silent; the others keep beating. Past dead_after, one leader round does it all.
    started = record_starts(c)
    c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
    await beat_all_but(c, dead)
    await c.plane.reconciler.tick()
    assert sorted(started) == sorted(s["id"] for s in recreate)
    for s in recreate:
        now = await get(c, s["id"])
        assert now["state"] == "running", now
        assert now["host_id"] != dead and now["epoch"] == 1 and now["recreated_at"]
        assert (now["name"], now["metadata"], now["tenant"]) == (s["name"], s["metadata"], s["tenant"])
        assert await routable_hosts(c, s["id"]) == {now["host_id"]}
        # Its env and secrets came back from the sealed spec.
        r = await c.http.post(f"/v1/sandboxes/{s['id']}/exec", json={"command": ["env"]}, headers=H)
        assert r.status_code == 200 and "PLAIN=p" in r.json()["stdout"]
        assert f"TOKEN={CANARY}" in r.json()["stdout"]
    for s in orphan:
        assert (await get(c, s["id"]))["state"] == "orphaned"
        r = await c.http.post(f"/v1/sandboxes/{s['id']}/exec", json={"command": ["true"]}, headers=H)
        assert r.status_code == 410

    # The old copies still run on the silent host (cut off, not dead) but refuse the current epoch.
    old = agent(c, dead)
    for s in recreate:
        assert s["id"] in old.sandbox_ids()
        with pytest.raises(AgentConflict):
            await old.exec(s["id"], ExecRequest(command=["true"]), 1)

    # It returns: one heartbeat's reply stops its copies of the recreated ones; orphans come back.
    await old.beat()
    c.plane.view.invalidate()
    assert not {s["id"] for s in recreate} & set(old.sandbox_ids())
    await c.plane.reconciler.tick()
    for s in orphan:
        assert (await get(c, s["id"]))["state"] == "running"
        assert await routable_hosts(c, s["id"]) == {dead}
    for s in recreate:
        assert (await get(c, s["id"]))["host_id"] != dead

    # The secret is in no answer and not in the store's file.
    listing = await c.http.get("/v1/sandboxes", headers=H)
    assert CANARY not in listing.text
    for s in recreate:
        assert CANARY not in (await c.http.get(f"/v1/sandboxes/{s['id']}", headers=H)).text
    await c.plane.store.close()  # everything on disk, the write-ahead log folded in
    files = list(tmp_path.glob("corral.db*"))
    assert files and not any(CANARY.encode() in f.read_bytes() for f in files)


async def test_no_room_waits_recreating_and_is_placed_when_room_appears(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=2, memory_mb=4096)
    try:
        a, b = (x.id for x in c.fleet.agents)
        # Fill b, then put one recreate sandbox on a.
        filler = []
        while True:
            s = await make(c, memory_mb=1024)
            if s["host_id"] == a:
                victim_host = a
                break
            filler.append(s)
        assert (await c.http.delete(f"/v1/sandboxes/{s['id']}", headers=H)).status_code == 204
        victim = None
        while victim is None:
            s = await make(c, memory_mb=1024, failover="recreate")
            if s["host_id"] == victim_host:
                victim = s
            else:
                filler.append(s)
        # Fill b completely.
        while True:
            r = await c.http.post("/v1/sandboxes", json={"memory_mb": 1024}, headers=H)
            if r.status_code != 201:
                break
            if r.json()["host_id"] == b:
                filler.append(r.json())
        c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
        await beat_all_but(c, a)
        for _ in range(3):
            await c.plane.reconciler.tick()
            assert (await get(c, victim["id"]))["state"] == "recreating"
        # Room appears: the next round places it.
        on_b = [s for s in filler if (await get(c, s["id"]))["host_id"] == b]
        assert (await c.http.delete(f"/v1/sandboxes/{on_b[0]['id']}", headers=H)).status_code == 204
        await beat_all_but(c, a)
        await c.plane.reconciler.tick()
        now = await get(c, victim["id"])
        assert now["state"] == "running" and now["host_id"] == b and now["epoch"] == 1
    finally:
        await c.close()


async def test_a_leader_that_died_after_the_reassignment_is_finished_by_the_next(small: Cluster) -> None:
    c = small
    dead, (s,) = await on_one_host(c, 1, failover="recreate", secrets={"K": CANARY}, memory_mb=512)
    c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
    await beat_all_but(c, dead)
    # Step 1 and the conditional write of step 2, as a leader would, then it dies before the start.
    await c.plane.store.fail_host(dead, c.clock.now() - c.plane.config.timeouts.dead_after_s)
    rec = await c.plane.store.get_sandbox(s["id"])
    assert rec is not None and rec.state is SandboxState.RECREATING
    target = next(x.id for x in c.fleet.agents if x.id != dead)
    await c.plane.store.reassign_sandbox(
        s["id"], expect_version=rec.version, host_id=target, reservation_id="r-lost", placement="{}"
    )
    assert (await get(c, s["id"]))["state"] == "recreating"
    r = await c.http.post(f"/v1/sandboxes/{s['id']}/exec", json={"command": ["true"]}, headers=H)
    assert r.status_code == 409  # not routable while recreating: neither copy answers
    started = record_starts(c)
    await c.plane.reconciler.tick()
    assert started == [s["id"]]  # the next leader started the copy, and its start command
    now = await get(c, s["id"])
    assert now["state"] == "running" and now["host_id"] == target and now["epoch"] == 1
    assert s["id"] in agent(c, target).sandbox_ids()


async def test_a_sandbox_recreated_once_whose_new_host_dies_and_returns_is_recreated_again(
    small: Cluster,
) -> None:
    c = small
    first, (s,) = await on_one_host(c, 1, failover="recreate", memory_mb=512)
    c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
    await beat_all_but(c, first)
    await c.plane.reconciler.tick()
    moved = await get(c, s["id"])
    assert moved["state"] == "running" and moved["epoch"] == 1 and moved["recreated_at"]
    # Its new host is declared dead in turn; it returns before the leader's next round. The record
    # still carries the first recreate's ``recreated_at``: that reassignment is finished, not one to
    # resume on the host that was just declared dead (whose copy the fence stops).
    second = moved["host_id"]
    c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
    await beat_all_but(c, second)
    await c.plane.store.fail_host(second, c.clock.now() - c.plane.config.timeouts.dead_after_s)
    back = agent(c, second)
    await back.beat()
    c.plane.view.invalidate()
    assert s["id"] not in back.sandbox_ids()  # the fence's reply stopped its copy
    await c.plane.reconciler.tick()
    now = await get(c, s["id"])
    assert now["state"] == "running" and now["host_id"] != second and now["epoch"] == 2, now
    await back.beat()
    await beat_all_but(c, second)
    assert await routable_hosts(c, s["id"]) == {now["host_id"]}


async def test_drain_with_evacuation_moves_recreate_sandboxes_only(small: Cluster) -> None:
    c = small
    host, (rec_sb,) = await on_one_host(c, 1, failover="recreate", memory_mb=512)
    stay = await on_host(c, host, memory_mb=512)
    r = await c.http.post(f"/v1/hosts/{host}/drain", params={"evacuate": "true"}, headers=H)
    assert r.status_code == 200, r.text
    await c.advance(5)  # the creates above are in the hosts' heartbeats now, not in this replica's claims
    await c.plane.reconciler.tick()
    moved = await get(c, rec_sb["id"])
    assert moved["state"] == "running" and moved["host_id"] != host and moved["epoch"] == 1
    assert (await get(c, stay["id"]))["host_id"] == host
    # The drained host's next heartbeat stops its old copy.
    await agent(c, host).beat()
    assert rec_sb["id"] not in agent(c, host).sandbox_ids()
    assert stay["id"] in agent(c, host).sandbox_ids()


async def test_failover_and_secrets_are_validated(small: Cluster) -> None:
    c = small
    for body in (
        {"failover": "sometimes"},
        {"secrets": {"A": 1}},
        {"secrets": {"": "x"}},
        {"secrets": "x"},
    ):
        r = await c.http.post("/v1/sandboxes", json=body, headers=H)
        assert r.status_code == 422, (body, r.text)
        assert CANARY not in r.text
    r = await c.http.post(
        "/v1/templates", json={"name": "keep", "memory_mb": 256, "failover": "recreate"}, headers=H
    )
    assert r.status_code == 201 and r.json()["failover"] == "recreate"
    s = await make(c, template="keep", secrets={"S": CANARY})
    assert s["failover"] == "recreate" and CANARY not in json.dumps(s)
    # The spec is in the store sealed, under the sandbox's id: it opens for no other id.
    sealed = await c.plane.store.sealed_spec(s["id"])
    assert sealed is not None and CANARY not in sealed
    sealer = c.plane.creates.sealer
    assert sealer is not None and sealer.open(s["id"], sealed).secrets == {"S": CANARY}
    with pytest.raises(Exception, match="does not open"):
        sealer.open("sb-other", sealed)


async def test_a_restarted_agent_gets_secrets_again_for_what_it_owns_only(small: Cluster) -> None:
    c = small
    host, (mine,) = await on_one_host(c, 1, secrets={"S": CANARY}, memory_mb=512)
    a = agent(c, host)
    # What a restart leaves: the sandbox adopted from the runtime's records, no secret in memory.
    a._secrets.clear()
    a._restore.add(mine["id"])
    r = await c.http.post(f"/v1/sandboxes/{mine['id']}/exec", json={"command": ["env"]}, headers=H)
    assert CANARY not in r.json()["stdout"]
    await a.beat()
    assert not a._restore
    r = await c.http.post(f"/v1/sandboxes/{mine['id']}/exec", json={"command": ["env"]}, headers=H)
    assert f"S={CANARY}" in r.json()["stdout"]
    # Another host asking for a sandbox it does not own (or a stale epoch of one) gets nothing.
    other = next(x for x in c.fleet.agents if x.id != host)
    hb = other.heartbeat().model_copy(update={"restore": [mine["id"]], "seq": other._seq + 10})
    reply = await c.plane.heartbeat_reply(hb)
    assert reply.secrets == {}


async def test_a_host_that_returns_empty_ends_its_orphans(small: Cluster) -> None:
    c = small
    dead, recreate = await on_one_host(c, 2, failover="recreate", memory_mb=512)
    orphan = [await on_host(c, dead, memory_mb=512) for _ in range(2)]
    c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
    await beat_all_but(c, dead)
    await c.plane.reconciler.tick()
    for s in orphan:
        assert (await get(c, s["id"]))["state"] == "orphaned"

    # The host died with its sandboxes: it comes back running none of them.
    old = agent(c, dead)
    for sid in list(old.sandbox_ids()):
        await old.stop(sid)
    assert old.sandbox_ids() == []
    for _ in range(2):  # missing from two heartbeats in a row, as a restarted agent's first may be partial
        c.clock.advance(0.5)
        await old.beat()
        await beat_all_but(c, dead)
        await c.plane.reconciler.tick()
    for s in orphan:
        assert (await get(c, s["id"]))["state"] == "stopped"
    for s in recreate:
        now = await get(c, s["id"])
        assert now["state"] == "running" and now["host_id"] != dead and now["epoch"] == 1
