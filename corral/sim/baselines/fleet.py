"""The model fleet (``ModelFleet``, beside the simulator's ``RealFleet`` of real agents and flows, and
``corral serve``'s ``LocalFleet``): hosts heartbeating into a store, scheduler replicas reading it through their
own view caches, and corral's create flow run by the core's ``Scheduler`` on a virtual clock.

Create flow, per attempt: the replica reads its cached view (re-read once before refusing: a cached
absence is not a death), the core scheduler filters, scores, selects and reserves; the agent re-checks
(its own gate, starts limiter, pressure gate) and either starts the sandbox or refuses, in which case
the reservation is cancelled and the host excluded. A reservation is held until a heartbeat accounting
for the sandbox has had ``view_ttl_s`` to reach every replica's view, then released by its owner; a
crashed owner's reservations end with its lease, or at the ledger's TTL as the last resort.

Every random draw comes from a ``random.Random`` derived from the run's seed and a component's name, so
a run is a pure function of (configuration, seed): a failing seed replays exactly.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from corral.core import (
    CreateRequest,
    HostView,
    Ledger,
    Placer,
    Refusal,
    Reservation,
    Scheduler,
    TouchModel,
)
from corral.sim.baselines.events import EventLoop
from corral.sim.baselines.host import SimHost
from corral.sim.baselines.policies import LedgerScope, Policy
from corral.sim.scenario import ClientBackoff, HostSpec, Router, check_split

T = TypeVar("T")


class Outcome:
    """Create-level outcomes that are not a placement (counted beside the agents' refusal reasons)."""

    REPLICA_CRASHED = "replica_crashed"
    GAVE_UP = "gave_up"
    NO_REPLICA = "no_replica"


@dataclass(frozen=True, slots=True)
class ModelFleetConfig:
    hosts: int
    policy: Policy
    host: HostSpec = field(default_factory=HostSpec)
    replicas: int = 1
    view_ttl_s: float = 30.0
    # None: view_ttl_s + 3 heartbeats, so a view cached for its whole TTL does not make healthy hosts
    # look dead (a 30 s cutoff beside a 30 s cache turns a remembered absence into a death).
    stale_after_s: float | None = None
    split: str = "round_robin"  # or "random"
    ledger_ttl_s: float = 120.0
    # A replica's lease: its reservations are dropped this long after it dies. None: TTL only.
    lease_s: float | None = 10.0
    touch: TouchModel = field(default_factory=TouchModel)
    bind_attempts: int = 6
    retry: ClientBackoff = field(default_factory=ClientBackoff)

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.replicas < 1:
            raise ValueError("a fleet needs at least one host and one replica")
        check_split(self.split)
        if self.view_ttl_s < 0:
            raise ValueError("view_ttl_s must not be negative")

    @property
    def stale_after(self) -> float:
        if self.stale_after_s is not None:
            return self.stale_after_s
        return self.view_ttl_s + 3 * self.host.heartbeat_s * (1 + self.host.heartbeat_jitter)


class HostTable:
    """The state of record's host table: the latest heartbeat of every host."""

    def __init__(self) -> None:
        self.latest: dict[str, HostView] = {}
        self._snapshot: tuple[HostView, ...] | None = None

    def publish(self, view: HostView) -> None:
        self.latest[view.id] = view
        self._snapshot = None

    def snapshot(self) -> tuple[HostView, ...]:
        if self._snapshot is None:
            self._snapshot = tuple(self.latest.values())
        return self._snapshot


class SimReplica:
    """A scheduler replica: the core ``Scheduler`` behind a view cache with a TTL."""

    def __init__(self, id: str, scheduler: Scheduler, store: HostTable, view_ttl_s: float) -> None:
        self.id = id
        self.scheduler = scheduler
        self.store = store
        self.view_ttl_s = view_ttl_s
        self.alive = True
        self.read_at = float("-inf")
        self.hosts: tuple[HostView, ...] = ()

    def view(self, now: float) -> tuple[HostView, ...]:
        if now - self.read_at >= self.view_ttl_s:
            self.refresh(now)
        return self.hosts

    def refresh(self, now: float) -> None:
        self.hosts = self.store.snapshot()
        self.read_at = now


@dataclass(slots=True)
class Create:
    id: int
    req: CreateRequest
    lifetime_s: float | None
    submitted_at: float
    attempts: int = 0
    placed_on: str | None = None


@dataclass(slots=True)
class Metrics:
    placements: Counter[str] = field(default_factory=Counter)
    refusals: Counter[str] = field(default_factory=Counter)
    placed: int = 0
    view_age_sum: float = 0.0
    decisions: int = 0
    # Per create that was refused at least once and then placed: seconds from first refusal to success.
    waits_s: list[float] = field(default_factory=list)

    @property
    def mean_view_age_s(self) -> float:
        return self.view_age_sum / self.decisions if self.decisions else 0.0


class ModelFleet:
    def __init__(self, cfg: ModelFleetConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.loop = EventLoop()
        self.rng = self.stream("fleet")
        pol = cfg.policy
        spec = cfg.host
        if spec.gate != pol.agent_gate or spec.starts_limit != pol.starts_limit:
            # The policy decides what the agent enforces; the spec carries the rest of the hardware.
            spec = replace(spec, gate=pol.agent_gate, starts_limit=pol.starts_limit)
        self.spec = spec
        width = max(2, len(str(cfg.hosts - 1)))
        self.hosts = [
            SimHost(f"h{i:0{width}d}", spec, cfg.touch, self.stream(f"host/{i}")) for i in range(cfg.hosts)
        ]
        self.by_id = {h.id: h for h in self.hosts}
        self.store = HostTable()
        clock = self.loop.clock
        self.shared_ledger = Ledger(clock, cfg.ledger_ttl_s) if pol.ledger is LedgerScope.SHARED else None
        placer = Placer(selector=pol.selector(), stale_after_s=cfg.stale_after, policy=spec.policy)
        self.replicas: list[SimReplica] = []
        for r in range(cfg.replicas):
            rid = f"r{r}"
            ledger: Ledger | None
            if pol.ledger is LedgerScope.SHARED:
                ledger = self.shared_ledger
            elif pol.ledger is LedgerScope.REPLICA:
                ledger = Ledger(clock, cfg.ledger_ttl_s)
            else:
                ledger = None
            sched = Scheduler(placer, ledger, self.stream(f"replica/{r}"), owner=rid)
            self.replicas.append(SimReplica(rid, sched, self.store, cfg.view_ttl_s))
        self.metrics = Metrics()
        self._ids = 0
        self.router: Router[SimReplica] = Router(cfg.split, self.rng)
        self._unconfirmed: dict[str, list[tuple[float, Reservation, SimReplica]]] = {
            h.id: [] for h in self.hosts
        }
        self._first_refusal: dict[int, float] = {}
        self._started = False

    # -- set-up ---------------------------------------------------------------------------------

    def stream(self, name: str) -> random.Random:
        """An independent, reproducible random stream for one component."""
        return random.Random(f"{self.seed}/{name}")

    def new_id(self) -> int:
        self._ids += 1
        return self._ids

    def start(self) -> None:
        """Begin heartbeats (each host at a random phase) and memory ticks."""
        if self._started:
            return
        self._started = True
        for h in self.hosts:
            self.loop.at(self.rng.uniform(0.0, h.spec.heartbeat_s), self._heartbeat, h)
            tick = h.spec.memory_tick_s
            if tick is not None:
                self.loop.at(self.rng.uniform(0.0, tick), self._memory_tick, h)

    def warm_views(self, start: float, end: float) -> None:
        """Have each replica read its view once at a random moment in [start, end)."""
        for r in self.replicas:
            self.loop.at(self.rng.uniform(start, end), self._refresh, r)

    def _refresh(self, r: SimReplica) -> None:
        r.refresh(self.loop.now())

    # -- workload ------------------------------------------------------------------------------

    def submit(self, req: CreateRequest, at: float, lifetime_s: float | None = None) -> Create:
        c = Create(self.new_id(), req, lifetime_s, at)
        self.loop.at(at, self._arrive, c)
        return c

    def burst(self, req: CreateRequest, n: int, start: float, window_s: float) -> list[Create]:
        """``n`` concurrent creates arriving uniformly within ``window_s`` of ``start``."""
        times = sorted(start + self.rng.uniform(0.0, window_s) for _ in range(n))
        return [self.submit(req, t) for t in times]

    def poisson(
        self,
        req: CreateRequest,
        rate_per_s: float,
        start: float,
        end: float,
        lifetime_mean_s: float | None = None,
    ) -> int:
        """A Poisson stream of creates; lifetimes exponential with the given mean (None: forever)."""
        t = start
        n = 0
        while True:
            t += self.rng.expovariate(rate_per_s)
            if t >= end:
                return n
            life = self.rng.expovariate(1.0 / lifetime_mean_s) if lifetime_mean_s else None
            self.submit(req, t, life)
            n += 1

    # -- faults --------------------------------------------------------------------------------

    def crash_replica(self, index: int, at: float) -> None:
        self.loop.at(at, self._crash, self.replicas[index])

    def host_outage(self, index: int, start: float, end: float) -> None:
        """The host stops heartbeating and answering at ``start`` and comes back at ``end``."""
        host = self.hosts[index]
        self.loop.at(start, setattr, host, "reachable", False)
        self.loop.at(end, setattr, host, "reachable", True)

    def every(self, interval_s: float, fn: Callable[[float], None], start: float, end: float) -> None:
        """Call ``fn(now)`` every ``interval_s`` from ``start`` through ``end``."""

        def tick(t: float) -> None:
            fn(t)
            if t + interval_s <= end + 1e-9:
                self.loop.at(t + interval_s, tick, t + interval_s)

        self.loop.at(start, tick, start)

    def run(self, until: float) -> None:
        self.start()
        self.loop.run(until)

    # -- reads ---------------------------------------------------------------------------------

    def outstanding_mb(self) -> int:
        """Reserved memory not yet confirmed, over every ledger a live or dead replica holds."""
        if self.shared_ledger is not None:
            return self.shared_ledger.outstanding_mb()
        seen: set[int] = set()
        total = 0
        for r in self.replicas:
            led = r.scheduler.ledger
            if led is not None and id(led) not in seen and r.alive:
                seen.add(id(led))
                total += led.outstanding_mb()
        return total

    def live_counts(self) -> dict[str, int]:
        return {h.id: len(h.sandboxes) for h in self.hosts}

    def oom_events(self) -> int:
        return sum(h.oom_events for h in self.hosts)

    # -- the create flow -----------------------------------------------------------------------

    def _route(self) -> SimReplica | None:
        return self.router.pick([r for r in self.replicas if r.alive])

    def _arrive(self, c: Create) -> None:
        replica = self._route()
        if replica is None:
            self._refused(c, Outcome.NO_REPLICA)
            return
        self._place(c, replica)

    def _place(self, c: Create, replica: SimReplica) -> None:
        now = self.loop.now()
        c.attempts += 1
        exclude: set[str] = set()
        reread = False
        binds = 0
        m = self.metrics
        while True:
            hosts = replica.view(now)
            try:
                decision, res = replica.scheduler.schedule(hosts, c.req, now=now, exclude=frozenset(exclude))
            except Refusal as refusal:
                if not reread and replica.read_at < now:
                    replica.refresh(now)
                    reread = True
                    continue
                self._refused(c, refusal.code)
                return
            m.decisions += 1
            m.view_age_sum += decision.view_age_s
            host = self.by_id[decision.host.id]
            why = host.refusal(c.req)
            if why is None:
                self._admit(c, replica, host, res, now)
                return
            m.refusals[why] += 1
            if res is not None:
                res.release()
            exclude.add(host.id)
            binds += 1
            if binds >= self.cfg.bind_attempts:
                self._refused(c, why)
                return

    def _admit(
        self, c: Create, replica: SimReplica, host: SimHost, res: Reservation | None, now: float
    ) -> None:
        s = host.admit(c.id, c.req, now)
        c.placed_on = host.id
        m = self.metrics
        m.placements[host.id] += 1
        m.placed += 1
        first = self._first_refusal.pop(c.id, None)
        if first is not None:
            m.waits_s.append(now - first)
        self.loop.after(host.start_duration(), self._started_event, c, replica, host, s.id)
        if c.lifetime_s is not None:
            self.loop.after(c.lifetime_s, self._end, host, s.id)
        if res is not None:
            self._unconfirmed[host.id].append((now, res, replica))

    def _started_event(self, c: Create, replica: SimReplica, host: SimHost, sandbox_id: int) -> None:
        s = host.sandboxes.get(sandbox_id)
        if s is not None:
            host.started(s)
        if not replica.alive:
            # The sandbox runs, but the replica that would have answered the client is gone.
            self.metrics.refusals[Outcome.REPLICA_CRASHED] += 1

    def _end(self, host: SimHost, sandbox_id: int) -> None:
        host.remove(sandbox_id)

    def _refused(self, c: Create, reason: str) -> None:
        now = self.loop.now()
        self.metrics.refusals[reason] += 1
        self._first_refusal.setdefault(c.id, now)
        retry = self.cfg.retry
        window = min(retry.cap_s, retry.base_s * 2 ** (c.attempts - 1))
        delay = self.rng.uniform(0.0, window)
        if now + delay - c.submitted_at > retry.deadline_s:
            self.metrics.refusals[Outcome.GAVE_UP] += 1
            self._first_refusal.pop(c.id, None)
            return
        self.loop.after(delay, self._arrive, c)

    # -- agents and replicas over time ---------------------------------------------------------

    def _heartbeat(self, host: SimHost) -> None:
        now = self.loop.now()
        if host.reachable:
            self.store.publish(host.heartbeat(now))
            if host.spec.memory_tick_s is None:
                host.memory_tick(now)
            pending = self._unconfirmed[host.id]
            if pending:
                # This heartbeat accounts for every sandbox admitted so far; once every replica's
                # view can hold it, the reservations for them have done their job.
                release_at = now + self.cfg.view_ttl_s
                for _, res, replica in pending:
                    self.loop.at(release_at, self._confirm, res, replica)
                self._unconfirmed[host.id] = []
        self.loop.after(host.next_heartbeat_in(), self._heartbeat, host)

    def _confirm(self, res: Reservation, replica: SimReplica) -> None:
        if replica.alive:
            res.release()

    def _memory_tick(self, host: SimHost) -> None:
        host.memory_tick(self.loop.now())
        tick = host.spec.memory_tick_s
        if tick is not None:
            self.loop.after(tick, self._memory_tick, host)

    def _crash(self, replica: SimReplica) -> None:
        replica.alive = False
        led = replica.scheduler.ledger
        if led is not None and led is self.shared_ledger and self.cfg.lease_s is not None:
            self.loop.after(self.cfg.lease_s, led.drop_owner, replica.id)


def counts_for(hosts: Iterable[SimHost], placements: Counter[str]) -> dict[str, int]:
    """Placements per host with every host present, zero counts included."""
    return {h.id: placements.get(h.id, 0) for h in hosts}
