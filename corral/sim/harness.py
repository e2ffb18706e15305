"""What a run of corral's real control plane on virtual time is built from: one replica's create flow,
batch, deletes and reconciler wired as the server wires them, a real agent on the ``sim`` runtime, and
a run on the virtual-time loop with ids drawn from a seed. The deterministic simulation with faults
and the fleet experiments both build on these, so both drive the same code the server runs.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, cast

from corral import ids
from corral.agent.agent import Agent, HeartbeatSink
from corral.control.batch import BatchCreate
from corral.control.config import ControlConfig
from corral.control.create import CreateFlow
from corral.control.failover import Failover
from corral.control.metrics import Metrics
from corral.control.ports import AgentLookup, HostReader, ReconcilePort
from corral.control.reconcile import Reconciler
from corral.control.retry import RetryAfter
from corral.control.routes import RouteCache
from corral.control.sandboxes import Sandboxes
from corral.control.seal import Sealer
from corral.control.view import ViewCache
from corral.core.clock import Clock
from corral.core.touch import TouchModel
from corral.core.types import AdmissionMode
from corral.runtime.sim import SimRuntime, SimState
from corral.sim.vtime import run_virtual

START = 1_000_000.0  # virtual epoch seconds: far from 0, where a never-heard-from host sits


@dataclass(frozen=True, slots=True)
class ControlPlane:
    """One replica's control plane, as the server wires it."""

    config: ControlConfig
    view: ViewCache
    metrics: Metrics
    flow: CreateFlow
    batch: BatchCreate
    sandboxes: Sandboxes
    reconciler: Reconciler


def control_plane(
    store: ReconcilePort,
    agents: AgentLookup,
    config: ControlConfig,
    clock: Clock,
    rng: random.Random,
    sealer: Sealer | None = None,
) -> ControlPlane:
    t = config.timeouts
    metrics = Metrics()
    view = ViewCache(cast(HostReader, store), clock, t.view_ttl_s, t.heartbeat_interval_s)
    retry = RetryAfter(clock, t, config.retry_after_min_s, config.retry_after_max_s)
    routes = RouteCache()
    flow = CreateFlow(store, view, agents, config, clock, rng, metrics, retry)
    flow.sealer = sealer
    batch = BatchCreate(flow)
    sandboxes = Sandboxes(store, view, agents, routes)
    failover = Failover(store, view, flow, clock, t)
    reconciler = Reconciler(store, view, agents, config, clock, metrics, retry, routes, failover)
    return ControlPlane(config, view, metrics, flow, batch, sandboxes, reconciler)


def sim_agent(
    host_id: str,
    clock: Clock,
    rng: random.Random,
    state: SimState,
    *,
    memory_mb: int,
    cpus: float,
    heartbeat_interval_s: float,
    sink: HeartbeatSink,
    starts_limit: int,
    start_latency_s: float,
    admission: AdmissionMode,
    touch: TouchModel | None = None,
    settle_s: float | None = None,
) -> Agent:
    """The real agent over a simulated host's sandboxes (``state`` outlives the agent across a crash)."""
    runtime = SimRuntime(clock, rng, touch, state=state, start_latency_s=start_latency_s)
    return Agent(
        host_id,
        runtime,
        memory_mb,
        cpus,
        admission=admission,
        clock=clock,
        heartbeat_interval_s=heartbeat_interval_s,
        sink=sink,
        max_concurrent_starts=starts_limit,
        settle_s=settle_s,
    )


def run_seeded(main: Coroutine[Any, Any, Any], tag: str) -> Any:
    """Run ``main`` on a fresh virtual-time loop from :data:`START`, with every id drawn from ``tag``
    and corral's own logging quiet (a run is judged by what it returns, not by its log)."""
    ids.reseed(tag)
    quiet = logging.getLogger("corral")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        return run_virtual(main, START)
    finally:
        quiet.level = level
        ids.reseed(None)
