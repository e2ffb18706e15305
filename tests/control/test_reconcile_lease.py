"""A replica's lease is kept however long a leader's round takes: a round that outlasted the lease
(failover binding sandbox after sandbox) let a live replica's lease lapse, so the next leader ended its
in-flight reservations under it. Found by the deterministic simulation with faults; run here on
virtual time over the in-memory store model."""

from __future__ import annotations

import asyncio
import random

from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.create import CreateFlow
from corral.control.failover import Failover
from corral.control.metrics import Metrics
from corral.control.reconcile import Reconciler
from corral.control.retry import RetryAfter
from corral.control.routes import RouteCache
from corral.control.view import ViewCache
from corral.sim.models.store import ModelStore
from corral.sim.vtime import VirtualClock, run_virtual


async def _lapses_during_a_long_round(round_s: float) -> list[float]:
    loop = asyncio.get_running_loop()
    clock = VirtualClock(loop)
    store = ModelStore(clock, random.Random(0))
    config = ControlConfig(replica_id="r1", replica_lease_s=3.0, reconcile_interval_s=1.0)
    t = config.timeouts
    view = ViewCache(store, clock, t.view_ttl_s, t.heartbeat_interval_s)
    metrics, routes, agents = Metrics(), RouteCache(), LocalAgents()
    retry = RetryAfter(clock, t, config.retry_after_min_s, config.retry_after_max_s)
    flow = CreateFlow(store, view, agents, config, clock, random.Random(0), metrics, retry)
    rec = Reconciler(
        store, view, agents, config, clock, metrics, retry, routes, Failover(store, view, flow, clock, t)
    )

    async def long_round() -> None:
        await asyncio.sleep(round_s)

    rec.leader_work.append(long_round)
    task = loop.create_task(rec.run())
    lapsed = []
    try:
        for _ in range(int(3 * round_s / 0.25)):
            await asyncio.sleep(0.25)
            if rec.is_leader and store.replicas.get("r1", 0.0) <= clock.now():
                lapsed.append(clock.now())
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return lapsed


def test_a_leader_round_longer_than_the_lease_does_not_lapse_it() -> None:
    assert run_virtual(_lapses_during_a_long_round(10.0), 1_000_000.0) == []
