"""A fleet run through corral's own control plane: replicas built as the server builds them
(:func:`~corral.control.plane.build_replica`), each running the real :class:`CreateFlow` behind its own
:class:`ViewCache` over the in-memory store model (its ``reserve_best`` ranks and tie-breaks as the SQL
stores do), real agents with their gates and starts limiters on the ``sim`` runtime (each host's
physical memory bounded, its kernel's OOM killer watching it every ``memory_tick_s``), heartbeats
through the first live replica's heartbeat intake (OOM counts onto records, warm targets in the reply),
clients that retry with the SDK's policy and honour Retry-After, all on virtual time. No fault is
injected but the ones an experiment schedules (a replica's death).

Every random draw comes from a ``random.Random`` seeded from the run's seed and the drawing
component's name: a run is a pure function of (configuration, seed).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, cast

from corral.agent.agent import Agent
from corral.agent.client import AgentClient
from corral.agent.errors import AgentUnavailable
from corral.agent.protocol import AgentHeartbeat, HeartbeatReply
from corral.client.errors import CapacityUnavailable, CorralError, Unreachable
from corral.client.retry import RetryBudget
from corral.control.agents import AgentDirectory
from corral.control.config import ControlConfig
from corral.control.create import CreateSpec
from corral.control.plane import ControlPlane, build_replica
from corral.core.timeouts import Timeouts
from corral.core.touch import TouchModel
from corral.runtime.base import SandboxHandle, SandboxSpec
from corral.runtime.sim import SimSandbox, SimState
from corral.sim.flow.harness import (
    START,
    Guarded,
    Process,
    request,
    sim_agent,
)
from corral.sim.flow.vtime import VirtualClock
from corral.sim.scenario import ClientBackoff, HostSpec, Router, check_split, fixed_profile
from corral.store import SandboxRecord, SandboxState, Store
from corral.testing.agents import InMemoryAgentClient
from corral.testing.store import ModelStore

SETTLED_AGO_S = 3600.0  # preloaded sandboxes started this long before the run: measured, settled


@dataclass(frozen=True, slots=True)
class RealFleetConfig:
    hosts: int
    host: HostSpec
    replicas: int = 1
    view_ttl_s: float = 30.0
    stale_after_s: float = 72.0
    # Power-of-K sampling: K candidates per decision (0: every host; None: corral's log2 rule).
    k: int | None = 2
    split: str = "round_robin"  # or "random"
    reservation_ttl_s: float = 120.0
    replica_lease_s: float = 10.0
    # Run every replica's reconciler (lease renewal, leader's sweep of lapsed owners and expired
    # reservations). Off for a burst that only places: fewer events, the same placements.
    reconcile: bool = False
    bind_timeout_s: float = 30.0
    touch: TouchModel = field(default_factory=TouchModel)
    retry: ClientBackoff = field(default_factory=ClientBackoff)

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.replicas < 1:
            raise ValueError("a fleet needs at least one host and one replica")
        check_split(self.split)

    def timeouts(self) -> Timeouts:
        """The control plane's timeouts (a host is declared dead only far beyond a stale view)."""
        hb = self.host.heartbeat_s
        return Timeouts(
            heartbeat_interval_s=hb,
            stale_after_s=self.stale_after_s,
            dead_after_s=max(self.stale_after_s, hb) * 10,
            bind_timeout_s=self.bind_timeout_s,
            reservation_ttl_s=self.reservation_ttl_s,
            view_ttl_s=self.view_ttl_s,
        )

    def control(self, replica_id: str) -> ControlConfig:
        return ControlConfig(
            replica_id=replica_id, timeouts=self.timeouts(), k=self.k, replica_lease_s=self.replica_lease_s
        )


@dataclass(slots=True)
class Tally:
    placements: Counter[str] = field(default_factory=Counter)
    warm: Counter[str] = field(default_factory=Counter)  # of the placements, those claimed warm
    refusals: Counter[str] = field(default_factory=Counter)  # final refusals and agents' refusals
    placed: int = 0
    waits_s: list[float] = field(default_factory=list)  # first refusal -> success, per create


class _Agents(AgentDirectory):
    """A replica's connections to the fleet's agents, in memory; a dead replica reaches nothing."""

    def __init__(self, fleet: RealFleet, replica: Replica) -> None:
        self.fleet = fleet
        self.replica = replica

    def client(self, host_id: str, address: str) -> AgentClient:
        return _AgentClient(self.fleet.agents[host_id], self.replica)


class _AgentClient(InMemoryAgentClient):
    def __init__(self, agent: Agent, replica: Replica) -> None:
        self.agent = agent
        self.replica = replica

    def _agent(self) -> Agent:
        if not self.replica.alive:
            raise AgentUnavailable(message="this process is gone")
        return self.agent


class Replica(Process):
    def __init__(self, fleet: RealFleet, index: int) -> None:
        super().__init__()
        cfg = fleet.cfg
        self.id = f"r{index}"
        config = cfg.control(self.id)
        store = Guarded(fleet.store, self)
        self.plane: ControlPlane = build_replica(
            cast(Store, store), _Agents(fleet, self), config, fleet.clock, fleet.stream(f"replica/{self.id}")
        )


class RealFleet:
    """Build inside a running virtual loop (``harness.run_seeded``), then ``await setup()``."""

    def __init__(self, cfg: RealFleetConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.loop = asyncio.get_running_loop()
        self.clock = VirtualClock(self.loop)
        self.rng = self.stream("fleet")
        self.timeouts = cfg.timeouts()
        self.store = ModelStore(self.clock, self.stream("store/ids"))
        width = max(2, len(str(cfg.hosts - 1)))
        self.host_ids = [f"h{i:0{width}d}" for i in range(cfg.hosts)]
        self.states = {h: SimState(memory_mb=cfg.host.memory_mb) for h in self.host_ids}
        self.agents: dict[str, Agent] = {}
        self.replicas = [Replica(self, i) for i in range(cfg.replicas)]
        self.tally = Tally()
        self.tenant = ""
        self.router: Router[Replica] = Router(cfg.split, self.rng)
        self._background: set[asyncio.Task[Any]] = set()

    def stream(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}/{name}")

    def background(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = self.loop.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # -- set-up -------------------------------------------------------------------------------------

    def preload(self, host_id: str, memory_mb: int, resident_mb: int, cpus: float) -> None:
        """A sandbox the host already runs, long settled at ``resident_mb`` (before ``setup``)."""
        state = self.states[host_id]
        sid = f"pre-{host_id}-{len(state.sandboxes)}"
        sb = SandboxSpec(id=sid, memory_mb=memory_mb, cpus=cpus)
        handle = SandboxHandle(id=sid, spec=sb, started_at=START - SETTLED_AGO_S, ref=f"sim:{sid}")
        state.sandboxes[sid] = SimSandbox(handle, fixed_profile(memory_mb, resident_mb))

    async def setup(self) -> None:
        """Records for what hosts already run, agents adopting it, heartbeats at random phases, and
        (with ``reconcile``) every replica's reconciler."""
        cfg, spec = self.cfg, self.cfg.host
        self.tenant = (
            await self.store.create_tenant(
                "sim", max_sandboxes=1 << 30, max_memory_mb=1 << 50, max_cpus=1 << 30
            )
        ).id
        for host_id in self.host_ids:
            for s in self.states[host_id].sandboxes.values():
                hs = s.handle.spec
                await self.store.create_sandbox(
                    _record(hs, self.tenant),
                )
                await self.store.set_sandbox_state(hs.id, SandboxState.RUNNING, host_id=host_id)
            agent = sim_agent(
                host_id,
                self.clock,
                self.stream(f"runtime/{host_id}"),
                self.states[host_id],
                memory_mb=spec.memory_mb,
                cpus=spec.cpus,
                heartbeat_interval_s=spec.heartbeat_s,
                sink=self._sink,
                starts_limit=spec.starts_limit or 1 << 20,
                start_latency_s=spec.start_p50_s,
                admission=spec.mode,
                touch=cfg.touch,
                settle_s=spec.settle_s,
                pressure=spec.pressure,
            )
            await agent.adopt()
            self.agents[host_id] = agent
            self.background(agent.run_heartbeats(self.rng.uniform(0.0, spec.heartbeat_s)))
            if spec.memory_tick_s is not None:
                self.background(
                    self._kernel(host_id, spec.memory_tick_s, self.rng.uniform(0.0, spec.memory_tick_s))
                )
        if cfg.reconcile:
            for r in self.replicas:
                r.spawn(r.plane.reconciler.run())

    async def _kernel(self, host_id: str, tick_s: float, phase_s: float) -> None:
        await asyncio.sleep(phase_s)
        await self.states[host_id].run_kernel(self.clock, tick_s)

    async def _sink(self, hb: AgentHeartbeat) -> HeartbeatReply:
        """An agent heartbeats to the first replica that answers."""
        for r in self.replicas:
            if r.alive:
                return await r.plane.heartbeat_reply(hb)
        raise AgentUnavailable(message="no replica answers")

    def warm_views(self, start: float, end: float) -> None:
        """Have each replica read its view once at a random moment in [start, end) (loop times)."""
        for r in self.replicas:
            self.background(self._read_view(r, self.rng.uniform(start, end)))

    async def _read_view(self, r: Replica, at: float) -> None:
        await asyncio.sleep(at - self.loop.time())
        await r.plane.view.get(fresh=True)

    # -- workload -------------------------------------------------------------------------------------

    def _route(self) -> Replica | None:
        return self.router.pick([r for r in self.replicas if r.alive])

    async def create(self, spec: CreateSpec, key: str, at: float, lifetime_s: float | None = None) -> None:
        """One client's create at loop time ``at``, retried through the load balancer with the SDK's
        policy until placed or past its deadline; deleted ``lifetime_s`` after it was placed."""
        await asyncio.sleep(max(0.0, at - self.loop.time()))
        t = self.tally
        budget = RetryBudget(self.cfg.retry, self.loop.time, self.rng)
        while True:
            budget.attempt()
            try:
                rec = await self._call(spec, key)
            except CorralError as err:
                t.refusals[err.code] += 1
                if not (isinstance(err, Unreachable) or err.retryable):
                    return
                try:
                    delay = budget.after_refusal(err)
                except (CapacityUnavailable, Unreachable):
                    t.refusals["gave_up"] += 1
                    return
                await asyncio.sleep(delay)
                continue
            t.placed += 1
            t.placements[rec.host_id or ""] += 1
            if rec.warm:
                t.warm[rec.host_id or ""] += 1
            if budget.first_refusal_at is not None:
                t.waits_s.append(self.loop.time() - budget.first_refusal_at)
            if lifetime_s is not None:
                await asyncio.sleep(lifetime_s)
                await self._delete(rec.id)
            return

    async def _delete(self, sandbox_id: str) -> None:
        with contextlib.suppress(CorralError):
            await request(self._route(), lambda r: r.plane.sandboxes.delete(sandbox_id, self.tenant))

    async def _call(self, spec: CreateSpec, key: str) -> Any:
        got = await request(
            self._route(), lambda r: r.plane.creates.create(self.tenant, spec, idempotency_key=key)
        )
        return got[0]

    # -- reads --------------------------------------------------------------------------------------

    def outstanding_mb(self) -> int:
        """Reserved memory not yet confirmed by a heartbeat (the store's reservations)."""
        return sum(r.memory_mb for r in self.store.reservations.values())

    def held_by(self, owner: str) -> int:
        return sum(r.memory_mb for r in self.store.reservations.values() if r.owner == owner)

    def live_counts(self) -> list[int]:
        """Sandboxes each host runs now (what it runs, not what records say)."""
        return [len(self.states[h].sandboxes) for h in self.host_ids]

    def admittable(self) -> dict[str, int]:
        return {h: a.admittable_mb() for h, a in self.agents.items()}

    def agent_refusals(self) -> Counter[str]:
        """Binds the agents refused, by code, over every replica."""
        out: Counter[str] = Counter()
        for r in self.replicas:
            for metric in r.plane.metrics.agent_refusals.collect():
                for s in metric.samples:
                    if s.name.endswith("_total"):
                        out[s.labels["code"]] += int(s.value)
        return out

    def view_age(self) -> tuple[float, int]:
        """Sum and count of the view ages decisions were made on, over every replica."""
        total, n = 0.0, 0
        for r in self.replicas:
            reg = r.plane.metrics.registry
            total += reg.get_sample_value("corral_decision_view_age_seconds_sum") or 0.0
            n += int(reg.get_sample_value("corral_decision_view_age_seconds_count") or 0)
        return total, n


def _record(spec: SandboxSpec, tenant: str) -> SandboxRecord:
    """The record of a sandbox its host already runs: what it was started with."""
    return SandboxRecord(
        id=spec.id, tenant_id=tenant, template=spec.template, memory_mb=spec.memory_mb, cpus=spec.cpus
    )
