"""Deterministic simulation with faults: corral's real create flow, batch creates, parked creates,
heartbeat intake, reconciler and failover, on virtual time, over the in-memory store model and real agents on the ``sim`` runtime,
while hosts crash and return, heartbeats are lost, late or lose their reply (the agent's listing
falls back from changes to its whole set), replicas die mid-create, the store goes away for a while,
binds are slow or fail, and replicas' clocks disagree.

Several replicas, each built as the server builds one (:func:`~corral.control.plane.build_replica`),
run the real :class:`Reconciler` loop; the store lease makes one of them the leader, which also places
parked creates. Agents heartbeat through a live replica's intake. Clients create (some with ``wait_s``,
so that what fits nowhere is parked), create in batches and delete with the SDK's retry policy,
honouring Retry-After. Invariants are checked after every store and agent
call; a run is a pure function of (config, seed): every random draw comes from a ``random.Random``
seeded from the seed and the drawing component's name, and every event lands in a trace whose digest
identifies the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import multiprocessing
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

from corral.agent.agent import Agent
from corral.agent.client import AgentClient
from corral.agent.errors import AgentUnavailable
from corral.agent.protocol import (
    AgentHeartbeat,
    HeartbeatReply,
    SandboxInfo,
    StartSandbox,
)
from corral.client.errors import CapacityUnavailable, CorralError, Unreachable
from corral.client.retry import RetryBudget, RetryPolicy
from corral.control.agents import AgentDirectory
from corral.control.config import ControlConfig
from corral.control.create import CreateSpec
from corral.control.plane import build_replica
from corral.control.seal import Sealer
from corral.core.admission import DEFAULT_POLICY
from corral.core.fit import CPU, Term
from corral.core.listing import digest_of
from corral.core.timeouts import Timeouts
from corral.core.types import AdmissionMode
from corral.runtime.sim import SimState
from corral.sim.flow.harness import (
    START,
    Guarded,
    Process,
    request,
    run_seeded,
    sim_agent,
)
from corral.sim.flow.vtime import VirtualClock
from corral.store import (
    FAILOVER_ORPHAN,
    FAILOVER_RECREATE,
    HeartbeatResult,
    ReservationRecord,
    SandboxRecord,
    SandboxState,
    Store,
    StoreError,
)
from corral.store.rows import from_millicores
from corral.testing.agents import InMemoryAgentClient
from corral.testing.store import ModelStore

RESERVE_CALLS = frozenset({"reserve", "reserve_best", "reserve_batch"})
# Calls that change nothing: the state after them is the state checked after the previous step.
READS = frozenset(
    {"list_hosts", "get_host", "get_sandbox", "list_sandboxes", "expired_sandboxes", "next_expiry"}
    | {"get_template", "sealed_spec", "usage", "get_reservation", "get_placement"}
    | {"list_pools", "list_templates"}
)
ENDED = frozenset({SandboxState.STOPPED, SandboxState.DELETED})
# Two replicas' clocks may each be this far off (``_faults``' clock skew): a deadline one of them wrote
# may be judged by the other this much early or late.
SKEW_S = 1.5


@dataclass(frozen=True, slots=True)
class ChaosConfig:
    hosts: int = 3
    replicas: int = 3
    clients: int = 3
    duration_s: float = 30.0  # virtual seconds of load and faults
    settle_s: float = 25.0  # then no faults, every host back: the books must come right
    host_mb: int = 5120  # 3 GiB admittable after the policy's headroom
    host_cpus: float = 8.0
    tenant_max_sandboxes: int = 14
    # per-call fault probabilities
    heartbeat_lost: float = 0.08
    heartbeat_delayed: float = 0.08
    heartbeat_reply_lost: float = 0.05
    bind_failed: float = 0.04
    bind_slow: float = 0.05
    bind_reply_lost: float = 0.03
    timeouts: Timeouts = field(
        default_factory=lambda: Timeouts(
            heartbeat_interval_s=1.0,
            stale_after_s=3.0,
            dead_after_s=8.0,
            bind_timeout_s=2.0,
            reservation_ttl_s=6.0,
            view_ttl_s=0.5,
            # Each replica's clock may be 1.5 s off (``_faults``' skew): two of them, 3 s apart.
            max_clock_skew_s=3.0,
        )
    )
    replica_lease_s: float = 3.0
    reconcile_interval_s: float = 1.0
    # Of single creates, the share that may wait for capacity, and how long they wait (``wait_s``).
    wait_share: float = 0.4
    waits_s: tuple[float, ...] = (1.0, 3.0)


@dataclass(slots=True)
class Parked:
    """A create parked in ``waiting_capacity``, as the fault simulation follows it."""

    tenant: str
    order: tuple[float, str]  # its place in its tenant's queue, as the store lists it
    parked_at: float  # loop time
    wait_until: float  # by the parking replica's clock


@dataclass(frozen=True, slots=True)
class Violation:
    at: float
    invariant: str
    detail: str


@dataclass(slots=True)
class ChaosResult:
    seed: int
    violations: list[Violation]
    faults: Counter[str]
    outcomes: Counter[str]
    trace: list[str]
    digest: str

    @property
    def ok(self) -> bool:
        return not self.violations


def replay_command(seed: int) -> str:
    return f"corral sim chaos --seed {seed} --replay"


class World:
    def __init__(self, cfg: ChaosConfig, seed: int, loop: asyncio.AbstractEventLoop) -> None:
        self.cfg = cfg
        self.seed = seed
        self.loop = loop
        self.clock = VirtualClock(loop)
        self.trace: list[str] = []
        self.faults: Counter[str] = Counter()
        self.outcomes: Counter[str] = Counter()
        self.violations: list[Violation] = []
        self.outage_until = 0.0
        lat = self.rng("store/latency")
        self.store = ModelStore(
            self.clock,
            self.rng("store/ids"),
            latency=lambda: lat.choice((0.0, 0.0, 0.001, 0.004)),
            outage=lambda: self.loop.time() < self.outage_until,
        )
        self.fault_rng = self.rng("faults/calls")
        self.sealer = Sealer([hashlib.sha256(f"chaos/{seed}".encode()).digest()])
        self.hosts: dict[str, SimHost] = {}
        self.replicas: list[Replica] = []
        self.tenant = ""
        self.acked: dict[str, str] = {}  # sandbox id -> the client that was told it exists
        self.delete_requested: set[str] = set()
        self.died: dict[str, float] = {}  # replica id -> when it crashed
        # Starts whose caller never heard they succeeded (host, id, epoch): strays until stopped.
        self.unanswered_starts: set[tuple[str, str, int]] = set()
        self.calming = False  # faults have stopped
        self.parked: dict[str, Parked] = {}  # parked creates not yet seen to leave the queue
        self.waits_in_flight: dict[str, float] = {}  # a waiting create's key -> when it was asked
        # (host, heartbeat seq) -> the listing the store held right after applying that heartbeat's.
        self.applied_listings: dict[tuple[str, int], dict[str, int]] = {}

    def rng(self, name: str) -> random.Random:
        return random.Random(f"{self.seed}/{name}")

    def note(self, event: str) -> None:
        self.trace.append(f"{self.loop.time() - START:.6f} {event}")

    def fault(self, kind: str, detail: str = "") -> None:
        self.faults[kind] += 1
        self.note(f"fault {kind} {detail}".rstrip())

    def violate(self, invariant: str, detail: str) -> None:
        """Record a broken invariant (once per invariant: a state that stays broken is checked again
        at every step); the run ends at its next second."""
        if any(v.invariant == invariant for v in self.violations):
            return
        self.violations.append(Violation(self.loop.time() - START, invariant, detail))
        self.note(f"VIOLATION {invariant} {detail}")

    # -- invariants -----------------------------------------------------------------------------------

    def check(self) -> None:
        """What must hold after every step."""
        store = self.store
        for host in self.hosts.values():
            if host.agent is not None and host.agent.admittable_mb() < 0:
                self.violate(
                    "host_over_admittable", f"{host.id}: admittable {host.agent.admittable_mb()} MiB"
                )
        for tid in store.tenants:
            if store.counted_usage(tid) != store.recorded_usage(tid):
                self.violate(
                    "tenant_usage",
                    f"{tid}: counted {store.counted_usage(tid)}, records {store.recorded_usage(tid)}",
                )
        for sid, client in self.acked.items():
            if sid in self.delete_requested:
                continue
            rec = store.sandboxes.get(sid)
            if rec is None or rec.state in (SandboxState.RESERVED, SandboxState.DELETED):
                state = "no record" if rec is None else rec.state.value
                self.violate("acked_create_lost", f"{sid} (acknowledged to {client}): {state}")
        # A create left ``reserved`` by a replica that died is settled once the replica's lease has
        # lapsed and a leader has had a few rounds (counted from the end of the latest store outage).
        cfg = self.cfg
        settle_s = 2 * cfg.replica_lease_s + 5 * cfg.reconcile_interval_s
        now = self.loop.time()
        for sid, rec in store.sandboxes.items():
            died = self.died.get(rec.owner or "")
            due = None if died is None else max(died, self.outage_until) + settle_s
            if rec.state is SandboxState.RESERVED and due is not None and now > due:
                self.violate(
                    "abandoned_create_unsettled",
                    f"{sid} still reserved {now - (died or 0.0):.3f}s after its replica {rec.owner} died",
                )
        self.check_parked(settle_s)
        self.check_running()
        # A new epoch is written to the record before its copy starts, so no copy is ever ahead of
        # it. Copies behind it, or a second copy of its epoch left by a start whose reply was lost,
        # are fenced or stopped as strays later: ``check_final`` holds that none is left.
        for sid, rec in store.sandboxes.items():
            for host in self.hosts.values():
                copy = host.state.sandboxes.get(sid)
                if copy is not None and copy.handle.spec.epoch > rec.epoch:
                    self.violate(
                        "copy_ahead_of_record",
                        f"{sid} runs on {host.id} at epoch {copy.handle.spec.epoch}; "
                        f"its record names {rec.host_id} at epoch {rec.epoch}",
                    )

    def check_running(self) -> None:
        """At no instant do two copies of one id run (unfrozen, routable or not) on hosts whose agent
        runs: a host cut off or declared dead has frozen or stopped its copy before another starts. Not counted yet: a crashed agent's copies (nothing on its host watches
        their lease: that needs the sandbox's own init to hold it), and a copy left by a start whose
        reply was lost (a stray, stopped by placement or later by the leader; ``check_final`` holds
        none is left)."""
        where: dict[str, list[str]] = {}
        for host in self.hosts.values():
            if host.agent is None:
                continue
            for sid, copy in host.state.sandboxes.items():
                epoch = copy.handle.spec.epoch
                if sid not in host.state.paused and (host.id, sid, epoch) not in self.unanswered_starts:
                    where.setdefault(sid, []).append(f"{host.id} (epoch {epoch})")
        for sid, on in sorted(where.items()):
            if len(on) > 1:
                rec = self.store.sandboxes.get(sid)
                record = (
                    "no record" if rec is None else f"{rec.state.value} on {rec.host_id} at epoch {rec.epoch}"
                )
                self.violate(
                    "two_running_copies", f"{sid} runs unfrozen on {', '.join(on)}; its record: {record}"
                )

    def check_parked(self, settle_s: float) -> None:
        """A parked create is never lost: it leaves the queue placed (running) or ended (deleted) at its
        deadline, never before it, and a leader ends it within a few rounds after; it never leaves its
        tenant's queue placed ahead of one parked before it that still waits (first come, first
        served within a tenant)."""
        store, now = self.store, self.loop.time()
        for sid, p in list(self.parked.items()):
            rec = store.sandboxes.get(sid)
            if rec is not None and rec.state is SandboxState.WAITING_CAPACITY:
                due = max(p.wait_until + 2 * SKEW_S, self.outage_until) + settle_s
                if now > due:
                    self.violate(
                        "parked_create_unsettled",
                        f"{sid} still waits {now - p.wait_until:.3f}s past its deadline",
                    )
                continue
            del self.parked[sid]
            if rec is None or rec.state is SandboxState.DELETED:
                self.outcomes["parked_expired"] += 1
                if now < p.wait_until - 2 * SKEW_S:
                    self.violate(
                        "parked_create_ended_early",
                        f"{sid} ended {p.wait_until - now:.3f}s before its deadline",
                    )
            elif rec.state is SandboxState.RUNNING:
                self.outcomes["parked_placed"] += 1
                for other, q in self.parked.items():
                    ahead = q.tenant == p.tenant and q.parked_at < p.parked_at and q.order < p.order
                    waits = store.sandboxes.get(other)
                    if ahead and waits is not None and waits.state is SandboxState.WAITING_CAPACITY:
                        self.violate(
                            "waiting_order", f"{sid} was placed while {other}, parked before it, waits"
                        )
            else:
                self.violate("parked_create_lost", f"{sid} left the queue {rec.state.value}")

    def check_listing(self, host_id: str, hb: AgentHeartbeat) -> None:
        """A heartbeat whose listing the store said it held: the store's copy, as it stood when that
        heartbeat was applied, is the set the agent described (its digest), entry for entry. Not the
        copy as it stands when the reply is back: a newer heartbeat may have been applied meanwhile
        (one delayed past its successor, or sent while this reply was being built), and the copy is
        then that one's, checked by its own delivery."""
        held = self.applied_listings.pop((host_id, hb.seq))
        if hb.digest is not None and digest_of(held) != hb.digest:
            self.violate(
                "listing_diverged",
                f"{host_id} heartbeat {hb.seq} (base {hb.base}): the store holds {sorted(held.items())}",
            )

    def check_grant(self, got: object) -> None:
        """A reservation is granted only where it fits: right after the grant, the host's reserved total
        is within its admittable."""
        granted = got if isinstance(got, list) else [got] if isinstance(got, ReservationRecord) else []
        for r in granted:
            h = self.store.hosts[r.host_id]
            f = h.facts
            if h.reserved_mb > f.memory_mb_admittable:
                self.violate(
                    "reservation_over_admittable",
                    f"{r.host_id}: {h.reserved_mb} MiB reserved, {f.memory_mb_admittable} MiB admittable",
                )
            values = {
                Term.CPU_USED: f.cpu_used,
                Term.PENDING_CPU: from_millicores(h.reserved_cpu_m),
                Term.REQUEST_CPU: 0.0,
                Term.CPU_TOTAL: f.cpu_total,
            }
            if not CPU.holds(values, DEFAULT_POLICY.cpu_overcommit):
                self.violate(
                    "reservation_over_cpu",
                    f"{r.host_id}: {h.reserved_cpu_m} mcpu reserved, {f.cpu_used} used of {f.cpu_total}",
                )

    def check_leases(self, began: float) -> None:
        """After a leader's round that began at ``began``, no reservation made before then may remain
        once its TTL or its owner's lease had run out by then (a lease that was ended counts from when
        it ended: a reservation made after that, by a replica that has not renewed yet, has its TTL)."""
        store = self.store
        for r in store.reservations.values():
            if r.created_at > began:
                continue
            if r.expires_at <= began:
                self.violate(
                    "reservation_outlived_ttl", f"{r.id} on {r.host_id} expired at {r.expires_at - START:.3f}"
                )
            lease = store.replicas.get(r.owner)
            lapsed = lease is not None and lease <= began
            ended = lease is None and r.created_at <= store.leases_ended.get(r.owner, float("-inf"))
            if lapsed or ended:
                self.violate(
                    "reservation_outlived_lease", f"{r.id} on {r.host_id}: owner {r.owner}'s lease ran out"
                )

    def check_final(self) -> None:
        """Once faults stop and every host is back: every acknowledged sandbox runs where its record
        says (or was explicitly ended), no sandbox runs on two hosts, no reservation is left."""
        store = self.store
        for sid in sorted(self.acked):
            if sid in self.delete_requested:
                continue
            rec = store.sandboxes[sid]
            self.outcomes[f"acked_at_end:{rec.state.value}"] += 1
            if rec.state is SandboxState.RUNNING:
                host = self.hosts.get(rec.host_id or "")
                copy = host.state.sandboxes.get(sid) if host is not None else None
                if copy is None or copy.handle.spec.epoch != rec.epoch:
                    self.violate("acked_not_running", f"{sid} is running on {rec.host_id} by its record only")
            elif rec.state not in ENDED and rec.state is not SandboxState.RECREATING:
                self.violate("acked_unsettled", f"{sid} is still {rec.state.value}")
        where: dict[str, list[str]] = {}
        for host in self.hosts.values():
            for sid in host.state.sandboxes:
                where.setdefault(sid, []).append(host.id)
        for sid, on in sorted(where.items()):
            if len(on) > 1:
                self.violate("two_live_copies", f"{sid} runs on {', '.join(sorted(on))}")
        if store.reservations:
            self.violate("reservation_leak", f"{len(store.reservations)} reservations outlive the run")
        now = self.loop.time()
        for key, asked in sorted(self.waits_in_flight.items()):
            self.violate("parked_create_unanswered", f"{key}, asked {now - asked:.3f}s ago, has no answer")

    def after(self, name: str, result: object) -> None:
        if name in READS:
            return
        if name == "park_sandbox" and isinstance(result, SandboxRecord):
            assert result.wait_until is not None
            self.parked[result.id] = Parked(
                result.tenant_id, (result.created_at, result.id), self.loop.time(), result.wait_until
            )
        if name == "upsert_heartbeat" and isinstance(result, HeartbeatResult):
            h = result.host
            if result.accepted and result.listed_seq == h.seq:
                listing = self.store.hosts[h.id].listing
                self.applied_listings[h.id, h.seq] = {s: e.epoch for s, e in listing.items() if e.present}
        if name in RESERVE_CALLS and result:
            self.check_grant(result)
        self.check()


class SimAgentClient(InMemoryAgentClient):
    """One replica's connection to one simulated host: the real agent, called in memory, behind a
    network that can be slow, fail, or lose the reply after the agent acted."""

    def __init__(self, host: SimHost, replica: Replica) -> None:
        self.host = host
        self.replica = replica

    def _agent(self) -> Agent:
        if not self.replica.alive or not self.host.up or self.host.agent is None:
            raise AgentUnavailable(message=f"host {self.host.id} cannot be reached")
        return self.host.agent

    async def start(self, req: StartSandbox) -> SandboxInfo:
        world, cfg = self.host.world, self.host.world.cfg
        agent = self._agent()
        f = world.fault_rng
        if not world.calming and f.random() < cfg.bind_failed:
            world.fault("bind_failed", f"{req.id} on {self.host.id}")
            raise AgentUnavailable(message="connection reset")
        if not world.calming and f.random() < cfg.bind_slow:
            world.fault("bind_slow", f"{req.id} on {self.host.id}")
            await asyncio.sleep(f.uniform(0.5, 3.0))
            agent = self._agent()
        gen = self.host.gen
        try:
            info = await agent.start(req)
        finally:
            world.check()
        if self.host.gen != gen or not self.replica.alive:
            world.unanswered_starts.add((self.host.id, req.id, req.epoch))
            raise AgentUnavailable(message="the host went away mid-start")
        if not world.calming and f.random() < cfg.bind_reply_lost:
            world.fault("bind_reply_lost", f"{req.id} on {self.host.id}")
            world.unanswered_starts.add((self.host.id, req.id, req.epoch))
            raise AgentUnavailable(message="connection reset after the start")
        return info

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        try:
            await self._agent().stop(sandbox_id, epoch)
        finally:
            self.host.world.check()


class SimAgents(AgentDirectory):
    def __init__(self, world: World, replica: Replica) -> None:
        self.world = world
        self.replica = replica

    def client(self, host_id: str, address: str) -> AgentClient:
        host = self.world.hosts.get(host_id)
        if host is None:
            raise AgentUnavailable(message=f"no host {host_id}")
        return SimAgentClient(host, self.replica)


class SimHost:
    def __init__(self, world: World, host_id: str) -> None:
        self.world = world
        self.id = host_id
        self.state = SimState()
        self.agent: Agent | None = None
        self.up = False
        self.gen = 0
        self._task: asyncio.Task[None] | None = None
        self._late: set[asyncio.Task[None]] = set()

    async def boot(self) -> None:
        w = self.world
        self.gen += 1
        agent = sim_agent(
            self.id,
            w.clock,
            w.rng(f"runtime/{self.id}/{self.gen}"),
            self.state,
            memory_mb=w.cfg.host_mb,
            cpus=w.cfg.host_cpus,
            heartbeat_interval_s=w.cfg.timeouts.heartbeat_interval_s,
            sink=self._sink,
            starts_limit=4,
            start_latency_s=0.05,
            admission=AdmissionMode.COMMITTED,
        )
        await agent.adopt()
        self.agent, self.up = agent, True
        self._task = asyncio.get_running_loop().create_task(agent.run_heartbeats())
        w.note(f"host {self.id} up (gen {self.gen}, {len(self.state.sandboxes)} sandboxes kept)")

    def crash(self, wipe: bool) -> None:
        self.up = False
        self.agent = None
        if self._task is not None:
            self._task.cancel()
        if wipe:
            self.state = SimState()  # it died with its sandboxes

    async def _sink(self, hb: AgentHeartbeat) -> HeartbeatReply | None:
        """The wire from the agent to a replica's heartbeat intake (the first live one, as an agent tries
        its control-plane URLs in turn): a heartbeat may be lost on the way, delayed (it lands after
        newer ones, or never counts), or land and lose its reply (the agent, unacknowledged, must send
        its whole set next)."""
        w = self.world
        f = w.fault_rng
        if not w.calming and f.random() < w.cfg.heartbeat_lost:
            w.fault("heartbeat_lost", self.id)
            raise ConnectionError("heartbeat lost")
        if not w.calming and f.random() < w.cfg.heartbeat_delayed:
            w.fault("heartbeat_delayed", self.id)
            delay = f.uniform(0.5, 4.0)

            async def late() -> None:
                with contextlib.suppress(StoreError, ConnectionError):
                    await self._deliver(hb, delay)

            task = asyncio.get_running_loop().create_task(late())
            self._late.add(task)
            task.add_done_callback(self._late.discard)
            return None
        reply = await self._deliver(hb)
        if not w.calming and f.random() < w.cfg.heartbeat_reply_lost:
            w.fault("heartbeat_reply_lost", self.id)
            raise ConnectionError("heartbeat reply lost")
        return reply

    async def _deliver(self, hb: AgentHeartbeat, delay: float = 0.0) -> HeartbeatReply:
        w = self.world
        if delay:
            await asyncio.sleep(delay)
        replica = next((r for r in w.replicas if r.alive), None)
        if replica is None:
            raise ConnectionError("no replica answers")
        reply = await replica.plane.heartbeat_reply(hb)
        kind = "whole" if hb.base is None else "changes"
        if not reply.accepted:
            w.outcomes["heartbeat_dropped"] += 1
        elif reply.listed_seq == hb.seq:
            w.outcomes[f"listing_{kind}_applied"] += 1
            w.check_listing(self.id, hb)
        else:
            w.outcomes[f"listing_{kind}_refused"] += 1
        w.check()
        return reply


class Replica(Process):
    def __init__(self, world: World, slot: int, gen: int) -> None:
        super().__init__()
        self.world = world
        self.id = f"r{slot}.{gen}"
        self.slot = slot
        self.gen = gen
        self.ready = False
        cfg = world.cfg
        t = cfg.timeouts
        self.clock = VirtualClock(world.loop)
        config = ControlConfig(
            replica_id=self.id,
            timeouts=t,
            replica_lease_s=cfg.replica_lease_s,
            reconcile_interval_s=cfg.reconcile_interval_s,
            retry_after_max_s=5.0,
        )
        guarded = Guarded(world.store, self, world.after)
        self.plane = build_replica(
            cast(Store, guarded),
            SimAgents(world, self),
            config,
            self.clock,
            world.rng(f"replica/{self.id}"),
            sealer=world.sealer,
        )

    def start(self) -> None:
        """The replica's real reconciler loop, each round followed by the lease checks when it led."""
        rec, w = self.plane.reconciler, self.world
        tick = rec.tick

        async def checked_tick() -> None:
            began = w.store.clock.now()
            await tick()
            self.ready = True
            if rec.is_leader:
                w.check_leases(began)

        rec.tick = checked_tick  # type: ignore[method-assign]
        self.spawn(rec.run())


class Client:
    def __init__(self, world: World, n: int) -> None:
        self.world = world
        self.name = f"c{n}"
        self.rng = world.rng(f"client/{n}")
        self.mine: list[str] = []
        self.creates = 0

    def _replica(self) -> Replica | None:
        up = [r for r in self.world.replicas if r.alive and r.ready]
        return self.rng.choice(up) if up else None

    async def _call(self, make: Callable[[Replica], Coroutine[Any, Any, Any]]) -> Any:
        """One request through a load balancer: a replica that dies mid-request is a lost connection."""
        return await request(self._replica(), make)

    async def _with_retries(self, what: str, make: Callable[[Replica], Coroutine[Any, Any, Any]]) -> Any:
        w = self.world
        budget = RetryBudget(RetryPolicy(base_s=0.25, cap_s=4.0, deadline_s=20.0), w.loop.time, self.rng)
        while True:
            budget.attempt()
            try:
                return await self._call(make)
            except CorralError as err:
                if not (isinstance(err, Unreachable) or err.retryable):
                    w.outcomes[f"{what}_refused:{err.code}"] += 1
                    return None
                w.outcomes[f"{what}_retried:{err.code}"] += 1
                try:
                    delay = budget.after_refusal(err)
                except (CapacityUnavailable, Unreachable):
                    w.outcomes[f"{what}_gave_up"] += 1
                    return None
                await asyncio.sleep(delay)

    def _spec(self, wait_s: float | None = None) -> CreateSpec:
        r = self.rng
        return CreateSpec(
            memory_mb=r.choice((256, 512, 1024)),
            cpus=0.5,
            failover=r.choice((FAILOVER_RECREATE, FAILOVER_ORPHAN)),
            wait_s=wait_s,
        )

    def _acked(self, sid: str) -> None:
        w = self.world
        if sid not in w.acked:
            w.acked[sid] = self.name
            self.mine.append(sid)
        w.note(f"ack {sid} to {self.name}")

    async def create(self) -> None:
        self.creates += 1
        key = f"{self.name}-{self.creates}"
        cfg, w = self.world.cfg, self.world
        wait_s = self.rng.choice(cfg.waits_s) if self.rng.random() < cfg.wait_share else None
        spec = self._spec(wait_s)
        tenant = w.tenant
        if wait_s is not None:
            w.waits_in_flight[key] = w.loop.time()
        try:
            got = await self._with_retries(
                "create", lambda rep: rep.plane.creates.create(tenant, spec, idempotency_key=key)
            )
        except Exception as exc:
            # Every answer a client gets is one of the API's: a waiting create's too.
            w.violate("create_answered_dishonestly", f"{key}: {exc!r}")
            raise
        finally:
            w.waits_in_flight.pop(key, None)
        if got is not None:
            self.world.outcomes["create_acked"] += 1
            self._acked(got[0].id)

    async def batch(self) -> None:
        spec = self._spec()
        count = self.rng.randint(2, 3)
        tenant = self.world.tenant
        got = await self._with_retries("batch", lambda rep: rep.plane.batches.create(tenant, spec, count))
        if got is not None:
            self.world.outcomes["batch_acked"] += 1
            for rec in got:
                self._acked(rec.id)

    async def delete(self) -> None:
        if not self.mine:
            return
        sid = self.mine.pop(self.rng.randrange(len(self.mine)))
        w = self.world
        w.delete_requested.add(sid)
        w.note(f"delete {sid}")
        tenant = w.tenant
        await self._with_retries("delete", lambda rep: rep.plane.sandboxes.delete(sid, tenant))

    async def run(self, until: float) -> None:
        r = self.rng
        while self.world.loop.time() < until:
            await asyncio.sleep(r.uniform(0.1, 1.2))
            x = r.random()
            if x < 0.55:
                await self.create()
            elif x < 0.7:
                await self.batch()
            else:
                await self.delete()


async def _faults(world: World, until: float) -> None:
    f = world.rng("faults/schedule")
    loop = world.loop
    pending: set[asyncio.Task[None]] = set()

    def later(delay: float, fn: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            await fn()

        task = loop.create_task(run())
        pending.add(task)
        task.add_done_callback(pending.discard)

    while loop.time() < until:
        await asyncio.sleep(f.uniform(0.5, 2.5))
        x = f.random()
        up_hosts = [h for h in world.hosts.values() if h.up]
        alive = [r for r in world.replicas if r.alive]
        if x < 0.2 and len(up_hosts) > 1:
            host = f.choice(up_hosts)
            wipe = f.random() < 0.5
            world.fault("host_crash", f"{host.id} wipe={wipe}")
            host.crash(wipe)
            later(f.uniform(1.0, 14.0), host.boot)
        elif x < 0.35 and len(alive) > 1:
            replica = f.choice(alive)
            in_flight = len(replica.tasks) - 1  # besides its reconciler loop
            world.fault("replica_crash", f"{replica.id} with {in_flight} requests in flight")
            if in_flight:
                world.fault("replica_crash_mid_request", replica.id)
            replica.crash()
            world.died[replica.id] = loop.time()

            async def restart(slot: int = replica.slot, gen: int = replica.gen + 1) -> None:
                fresh = Replica(world, slot, gen)
                world.replicas[slot] = fresh
                fresh.start()

            later(f.uniform(0.5, 3.0), restart)
        elif x < 0.45:
            span = f.uniform(0.2, 4.0)
            world.outage_until = max(world.outage_until, loop.time() + span)
            world.fault("store_outage", f"{span:.3f}s")
        elif x < 0.55:
            replica = f.choice(alive)
            replica.clock.skew_s = f.uniform(-1.5, 1.5)
            world.fault("clock_skew", f"{replica.id} {replica.clock.skew_s:+.3f}s")
    # Faults stop: every host comes back, the store answers.
    await asyncio.gather(*pending, return_exceptions=True)
    world.calming = True
    world.outage_until = 0.0
    for r in world.replicas:
        r.clock.skew_s = 0.0
    for host in world.hosts.values():
        if not host.up:
            await host.boot()


async def _run(world: World) -> None:
    cfg = world.cfg
    loop = world.loop
    store = world.store
    world.tenant = (
        await store.create_tenant(
            "chaos", max_sandboxes=cfg.tenant_max_sandboxes, max_memory_mb=1 << 30, max_cpus=1 << 30
        )
    ).id
    # Replicas first: the hosts' first heartbeats go through a replica's intake.
    world.replicas = [Replica(world, i, 0) for i in range(cfg.replicas)]
    for r in world.replicas:
        r.start()
    for i in range(cfg.hosts):
        host = world.hosts[f"h{i}"] = SimHost(world, f"h{i}")
        await host.boot()
    await asyncio.sleep(cfg.timeouts.heartbeat_interval_s)
    until = loop.time() + cfg.duration_s
    clients = [Client(world, i) for i in range(cfg.clients)]
    tasks = [loop.create_task(c.run(until)) for c in clients]
    tasks.append(loop.create_task(_faults(world, until)))
    try:
        end = until + cfg.settle_s
        while loop.time() < end and not world.violations:
            await asyncio.sleep(1.0)
        if not world.violations:
            world.check()
            world.check_final()
    finally:
        for t in tasks:
            t.cancel()
        for r in world.replicas:
            r.crash()
        for h in world.hosts.values():
            h.crash(False)


def run_seed(seed: int, cfg: ChaosConfig | None = None) -> ChaosResult:
    """One run: a pure function of (config, seed)."""
    cfg = cfg or ChaosConfig()
    holder: list[World] = []

    async def main() -> None:
        world = World(cfg, seed, asyncio.get_running_loop())
        holder.append(world)
        await _run(world)

    run_seeded(main(), f"chaos/{seed}")
    world = holder[0]
    digest = hashlib.sha256("\n".join([*world.trace, world.store.dump()]).encode()).hexdigest()
    return ChaosResult(seed, world.violations, world.faults, world.outcomes, world.trace, digest)


def run_seeds(seeds: Iterator[int] | range, cfg: ChaosConfig | None = None) -> Iterator[ChaosResult]:
    for seed in seeds:
        yield run_seed(seed, cfg)


def _run_one(seed: int) -> ChaosResult:
    result = run_seed(seed)
    result.trace = []  # a worker sends back the verdict; a replay rebuilds the trace
    return result


def run_many(seeds: range, jobs: int = 1) -> Iterator[ChaosResult]:
    """Seeds in order; with ``jobs`` > 1, in that many forked processes (each run is independent)."""
    if jobs <= 1:
        yield from run_seeds(seeds)
        return
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(jobs) as pool:
        yield from pool.imap(_run_one, seeds, chunksize=4)


def summary(results: list[ChaosResult], seconds: float, *, one: bool = False) -> dict[str, Any]:
    """What a run of seeds found: failing seeds, seeds per second, each fault injected and each outcome."""
    faults: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
        outcomes.update(r.outcomes)
    out: dict[str, Any] = {
        "seeds": len(results),
        "failed": [
            {"seed": r.seed, "invariant": v.invariant, "detail": v.detail, "replay": replay_command(r.seed)}
            for r in results
            for v in r.violations
        ],
        "faults": dict(sorted(faults.items())),
        "outcomes": dict(sorted(outcomes.items())),
    }
    if one:
        out["digest"] = results[0].digest
    else:
        out["seconds"] = round(seconds, 3)
        out["seeds_per_s"] = round(len(results) / seconds, 2) if seconds > 0 else None
    return out
