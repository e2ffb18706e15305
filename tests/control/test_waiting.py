"""Creates that wait for capacity, on an injected clock: parked in ``waiting_capacity`` when nothing
fits, placed by the leader's next round once room appears, first come first served within a tenant and
round-robin across tenants; 503 at the deadline; bound to their Idempotency-Key; bounded per tenant."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.client import AsyncCorral
from corral.store import SandboxState

from .conftest import ADMIN, Cluster, make_cluster

H = {"Authorization": f"Bearer {ADMIN}"}
MB = 512


@pytest.fixture
async def full(tmp_path: Path) -> AsyncIterator[tuple[Cluster, list[str]]]:
    """Two hosts with room for four 512 MiB sandboxes each, all taken."""
    c = await make_cluster(tmp_path, hosts=2, memory_mb=4096)
    c.plane.waiting.poll_s = 0.005
    running = []
    try:
        while True:
            r = await c.http.post("/v1/sandboxes", json={"memory_mb": MB}, headers=H)
            if r.status_code != 201:
                assert r.status_code == 503
                break
            running.append(r.json()["id"])
        assert len(running) == 8
        yield c, running
    finally:
        await c.close()


async def state(c: Cluster, sid: str) -> SandboxState | None:
    rec = await c.plane.store.get_sandbox(sid)
    return rec.state if rec else None


async def waiting_ids(c: Cluster, tenant: str | None = None) -> list[str]:
    page = await c.plane.store.list_sandboxes(
        tenant_id=tenant, state=SandboxState.WAITING_CAPACITY, limit=1000
    )
    return [s.id for s in page.items]


async def park(c: Cluster, body: dict[str, Any], headers: dict[str, str] = H) -> asyncio.Task[httpx.Response]:
    """Send a waiting create and return once it is parked (so the order of parking is the test's)."""
    before = set(await waiting_ids(c))
    c.clock.advance(0.01)  # records are ordered by creation time: give each its own
    task = asyncio.create_task(c.http.post("/v1/sandboxes", json=body, headers=headers))
    for _ in range(2000):
        if set(await waiting_ids(c)) - before or task.done():
            break
        await asyncio.sleep(0.002)
    assert not task.done(), (await task).text
    return task


async def free_one(c: Cluster, sid: str) -> None:
    assert (await c.http.delete(f"/v1/sandboxes/{sid}", headers=H)).status_code == 204
    await c.advance(0.5)  # the hosts' heartbeats show the room; this replica's old claims retire


async def test_twenty_parked_creates_are_placed_in_order_as_room_appears(
    full: tuple[Cluster, list[str]],
) -> None:
    c, running = full
    tasks = [await park(c, {"memory_mb": MB, "wait_s": 300, "env": {"N": str(i)}}) for i in range(20)]
    order = await waiting_ids(c)
    assert len(order) == 20
    r = await c.http.get(f"/v1/sandboxes/{order[0]}", headers=H)
    assert r.json()["state"] == "waiting_capacity"
    await c.plane.reconciler.tick()
    assert "corral_waiting_creates 20.0" in (await c.http.get("/metrics", headers=H)).text
    for i, sid in enumerate(order):
        await free_one(c, running.pop(0))
        await c.plane.reconciler.tick()  # one round after the room appeared
        assert await state(c, sid) is SandboxState.RUNNING, i
        assert all([await state(c, later) is SandboxState.WAITING_CAPACITY for later in order[i + 1 :]])
        done = await tasks[i]
        assert done.status_code == 201 and done.json()["id"] == sid
        running.append(sid)
        ex = await c.http.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["env"]}, headers=H)
        assert f"N={i}\n" in ex.json()["stdout"]  # its env came from the sealed spec
    assert "corral_create_waited_seconds_count 20.0" in (await c.http.get("/metrics", headers=H)).text


async def test_a_flooding_tenant_does_not_starve_another(full: tuple[Cluster, list[str]]) -> None:
    c, running = full
    tokens = {}
    for name in ("flood", "quiet"):
        r = await c.http.post("/v1/tenants", json={"name": name}, headers=H)
        assert r.status_code == 201, r.text
        tokens[name] = {"Authorization": f"Bearer {r.json()['token']}"}
    flood = [await park(c, {"memory_mb": MB, "wait_s": 300}, tokens["flood"]) for _ in range(6)]
    quiet = await park(c, {"memory_mb": MB, "wait_s": 300}, tokens["quiet"])
    await free_one(c, running.pop())
    await free_one(c, running.pop())
    await c.plane.reconciler.tick()
    assert (await quiet).status_code == 201
    assert (await flood[0]).status_code == 201
    assert len([t for t in flood if not t.done()]) == 5
    for t in flood[1:]:
        t.cancel()


async def test_the_deadline_answers_503_and_leaves_nothing(full: tuple[Cluster, list[str]]) -> None:
    c, _ = full
    task = await park(c, {"memory_mb": MB, "wait_s": 5})
    (sid,) = await waiting_ids(c)
    c.clock.advance(6)
    r = await task
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_capacity"
    assert await state(c, sid) is None


async def test_a_parked_create_is_bound_to_its_idempotency_key(full: tuple[Cluster, list[str]]) -> None:
    c, running = full
    keyed = {**H, "Idempotency-Key": "wait-once"}
    first = await park(c, {"memory_mb": MB, "wait_s": 300}, keyed)
    (sid,) = await waiting_ids(c)
    first.cancel()  # the client went away; the key keeps the create parked
    with pytest.raises(asyncio.CancelledError):
        await first
    assert await waiting_ids(c) == [sid]
    retry = asyncio.create_task(
        c.http.post("/v1/sandboxes", json={"memory_mb": MB, "wait_s": 300}, headers=keyed)
    )
    await asyncio.sleep(0.05)
    assert await waiting_ids(c) == [sid]  # attached, not parked twice
    await free_one(c, running.pop())
    await c.plane.reconciler.tick()
    r = await retry
    assert r.status_code == 201 and r.json()["id"] == sid

    # Without a key, a create whose client has gone is cancelled.
    lone = await park(c, {"memory_mb": MB, "wait_s": 300})
    (lone_id,) = await waiting_ids(c)
    lone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await lone
    assert await state(c, lone_id) is None


async def test_queue_length_and_wait_are_bounded(full: tuple[Cluster, list[str]]) -> None:
    c, _ = full
    c.plane.waiting.config = dataclasses.replace(c.plane.config, max_waiting_per_tenant=2)
    tasks = [await park(c, {"memory_mb": MB, "wait_s": 300}) for _ in range(2)]
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": MB, "wait_s": 300}, headers=H)
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    for bad in (0, -1, 301, "soon", 10**9):
        r = await c.http.post("/v1/sandboxes", json={"memory_mb": MB, "wait_s": bad}, headers=H)
        assert r.status_code == 422, (bad, r.text)
    assert len(await waiting_ids(c)) == 2
    for t in tasks:
        t.cancel()


async def test_the_sdk_waits_on_the_server(full: tuple[Cluster, list[str]]) -> None:
    c, running = full
    transport = httpx.ASGITransport(app=c.http._transport.app)  # type: ignore[attr-defined]
    async with AsyncCorral("http://corral.test", ADMIN, transport=transport) as client:
        task = asyncio.create_task(
            client.sandboxes.create(
                "default", memory_mb=MB, wait=120, secrets={"S": "hidden"}, failover="recreate"
            )
        )
        for _ in range(2000):
            if await waiting_ids(c):
                break
            await asyncio.sleep(0.002)
        await free_one(c, running.pop())
        await c.plane.reconciler.tick()
        sandbox = await task
        assert sandbox.record.state == "running" and sandbox.record.failover == "recreate"
