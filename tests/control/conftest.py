"""A whole control plane in one event loop: a real SQLite store, a local fleet of sim agents, and the
ASGI app reached through httpx's ASGI transport (no sockets, no patching)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.api.app import create_app
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.localfleet import LocalFleet, build_local_fleet
from corral.control.plane import ControlPlane, build_replica
from corral.control.seal import Sealer
from corral.core import AdmissionMode, AdmissionPolicy, ManualClock, Timeouts
from corral.images import DirBlobStore
from corral.store import open_store

ADMIN = "admin-token-for-tests"
AGENT = "agent-token-for-tests"
SEAL_KEY = bytes(range(32))


@dataclass
class Cluster:
    plane: ControlPlane
    fleet: LocalFleet
    clock: ManualClock
    http: httpx.AsyncClient

    def as_(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}

    async def beat(self) -> None:
        """Every agent heartbeats now (as its loop would), and the view forgets what it cached."""
        for a in self.fleet.agents:
            await a.beat()
        self.plane.view.invalidate()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.beat()

    async def close(self) -> None:
        await close_cluster(self)


async def make_cluster(
    tmp_path: Path,
    *,
    hosts: int = 12,
    memory_mb: int = 32768,
    cpus: float = 16.0,
    admission: AdmissionMode = AdmissionMode.WORKING_SET,
    seed: int = 1,
    runtime: str = "sim",
) -> Cluster:
    clock = ManualClock(1_000_000.0)
    store = open_store(f"sqlite:///{tmp_path / 'corral.db'}", clock=clock)
    policy = AdmissionPolicy(headroom_mb=2048)
    config = ControlConfig(
        replica_id="replica-test",
        timeouts=Timeouts(heartbeat_interval_s=2, stale_after_s=10, dead_after_s=60, view_ttl_s=1),
        policy=policy,
    )
    directory = LocalAgents()
    plane = build_replica(
        store,
        directory,
        config,
        clock,
        random.Random(seed),
        sealer=Sealer([SEAL_KEY]),
        blobs=DirBlobStore(tmp_path / "blobs"),
    )
    fleet = build_local_fleet(
        plane,
        directory,
        hosts=hosts,
        runtime=runtime,
        memory_mb=memory_mb,
        cpus=cpus,
        admission=admission,
        policy=policy,
        heartbeat_interval_s=2,
        seed=seed,
        state_root=tmp_path / "state",
    )
    await plane.start(admin_token=ADMIN, agent_token=AGENT)
    # The reconciler loop would run on wall time; tests drive it by hand.
    if plane._task is not None:
        plane._task.cancel()
    for a in fleet.agents:
        await a.beat()
    app = create_app(plane, manage=False)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://corral.test")
    return Cluster(plane, fleet, clock, http)


async def close_cluster(c: Cluster) -> None:
    await c.http.aclose()
    await c.plane.stop()
    await c.plane.store.close()


Send = Callable[[dict[str, Any]], httpx.Response]


def run_beside_cluster(
    tmp_path: Path,
    body: Callable[[Cluster, Send], None],
    setup: Callable[[Cluster], Awaitable[None]] | None = None,
    **cluster_args: Any,
) -> None:
    """A cluster on an event loop of its own, and the synchronous ``body`` (a hypothesis test) run in a
    worker thread beside it, sending ``httpx`` request arguments through ``send``."""

    async def scenario() -> None:
        c = await make_cluster(tmp_path, **cluster_args)
        loop = asyncio.get_running_loop()

        def send(request: dict[str, Any]) -> httpx.Response:
            return asyncio.run_coroutine_threadsafe(c.http.request(**request), loop).result(30)

        try:
            if setup is not None:
                await setup(c)
            await asyncio.to_thread(body, c, send)
        finally:
            await close_cluster(c)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(scenario())
    finally:
        loop.close()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = await make_cluster(tmp_path)
    try:
        yield c
    finally:
        await close_cluster(c)
