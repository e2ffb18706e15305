"""The placement step, as every sandbox gets it (a create, a batch, a recreate after failover, a parked
create), in the shape of Nomad's scheduler: :meth:`Placement.decide` reads a snapshot of the fleet and
names a :class:`Plan` (the host, the candidates offered the store, the charge, the explanation's
attempt); it is pure and synchronous, and never asks the store. :meth:`Placement.apply` carries a plan
out: reserve in the store, start on the host's agent, write the record; a bind that fails ends what the
attempt took (the reservation cancelled, a copy that may have started stopped), unless the record shows
a lost reply's copy is the sandbox. :meth:`Placement.place` runs the two until a host takes it, or
refuses with the filter that said no to each host.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import InitVar, dataclass, field, replace

from corral.agent.errors import AgentError, AgentRefusal
from corral.codes import ErrorCode
from corral.control.binding import Binder, as_bad_gateway, elsewhere_reason
from corral.control.config import ControlConfig
from corral.control.errors import ResourceNotFound, Unavailable
from corral.control.explain import Attempt, Explanation
from corral.control.metrics import Metrics
from corral.control.ports import AgentLookup, FailoverPort
from corral.control.retry import RetryAfter
from corral.control.seal import Spec
from corral.control.templates import Templates
from corral.control.view import FleetSnapshot, ViewCache
from corral.core import (
    Clock,
    CreateRequest,
    Decision,
    FullScan,
    NoCapacity,
    NoHealthyHosts,
    Pending,
    Placer,
    PowerOfK,
    Refusal,
    Scorer,
    Strategy,
    candidate_limit,
)
from corral.core.filters import PendingFn
from corral.logs import note
from corral.store import (
    RecordNotFound,
    ReservationRecord,
    ReserveItem,
    SandboxRecord,
    SandboxState,
    StateConflict,
    StoreError,
)

# Below the agents' default starts limit (8), so one batch does not saturate a host by itself.
PER_HOST_STARTS = 4
SATURATED_RETRIES = 5


@dataclass(frozen=True, slots=True)
class Snapshot:
    """All a decision reads: the fleet as last read, what is pending on each host (the store's reserved
    totals at that read plus this replica's claims since), and the time."""

    fleet: FleetSnapshot
    pending: PendingFn
    now: float

    def including(self, plans: Sequence[Plan]) -> Snapshot:
        """This snapshot with ``plans`` (decided, not yet reserved) charged on their hosts, so the next
        decision sees them: a batch's members are decided one after another against it."""
        extra: dict[str, Pending] = {}
        for p in plans:
            had = extra.get(p.host, Pending())
            extra[p.host] = Pending(had.memory_mb + p.charge_mb, had.cpu + p.request.cpu)
        base = self.pending

        def pending(host_id: str) -> Pending:
            x, y = base(host_id), extra.get(host_id, Pending())
            return Pending(x.memory_mb + y.memory_mb, x.cpu + y.cpu)

        return replace(self, pending=pending)


@dataclass(frozen=True, slots=True)
class Plan:
    """One decision: where the sandbox should go, and what to ask of the store there."""

    request: CreateRequest
    decision: Decision
    # The hosts offered the store's reservation: spreading, the candidates charged as the chosen one
    # (the store takes the one with most room by its current totals); packing, the chosen host.
    offered: tuple[str, ...]
    attempt: Attempt = field(compare=False)

    @property
    def host(self) -> str:
        return self.decision.host.id

    @property
    def charge_mb(self) -> int:
        return self.decision.charge_mb


@dataclass(frozen=True, slots=True)
class Start:
    """What the chosen host starts, and how its record is written once it runs. The record's state says
    which placement it is: ``reserved`` a create, ``waiting_capacity`` a parked create, ``recreating``
    a recreate after failover (given the host and a new epoch before it starts)."""

    record: SandboxRecord
    env: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    # A create's Idempotency-Key and request fingerprint (to write a resolved record again under it).
    key: tuple[str, str] | None = None

    @classmethod
    def of(cls, record: SandboxRecord, spec: Spec, key: tuple[str, str] | None = None) -> Start:
        """``record`` started with ``spec``'s env and secrets: the two travel together, never one alone."""
        return cls(record, spec.env, spec.secrets, key)


@dataclass(frozen=True, slots=True)
class Rejected:
    """A plan the fleet did not take: the hosts to leave out of the next decision, and why (None: the
    store had no room left on the offered hosts). ``record``: the sandbox's record as the attempt left
    it (a recreate's reassignment moves its version)."""

    hosts: tuple[str, ...]
    reason: str | None
    record: SandboxRecord


def _names_copy(current: SandboxRecord, host_id: str | None, epoch: int) -> bool:
    """Whether the store's record now says the copy on ``host_id`` at ``epoch`` is the sandbox, running."""
    return current.state is SandboxState.RUNNING and current.host_id == host_id and current.epoch == epoch


@dataclass(eq=False, repr=False)
class Placement:
    store: FailoverPort
    view: ViewCache
    agents: InitVar[AgentLookup]
    templates: Templates
    config: ControlConfig
    clock: Clock
    rng: random.Random
    metrics: Metrics
    retry_after: RetryAfter
    binder: Binder = field(init=False)
    _placers: dict[int, Placer] = field(default_factory=dict, init=False)

    def __post_init__(self, agents: AgentLookup) -> None:
        self.binder = Binder(agents, self.config.timeouts.bind_timeout_s)

    def placer(self, n_hosts: int) -> Placer:
        """The placer for a fleet of ``n_hosts``: K is fixed by configuration or grows as log2 n."""
        k = self.config.k if self.config.k is not None else candidate_limit(n_hosts)
        placer = self._placers.get(k)
        if placer is None:
            selector = FullScan() if k == 0 else PowerOfK(k)
            placer = self._placers[k] = Placer(
                selector=selector,
                scorer=Scorer(strategy=self.config.strategy, policy=self.config.policy),
                stale_after_s=self.config.timeouts.stale_after_s,
                policy=self.config.policy,
            )
        return placer

    # -- deciding ----------------------------------------------------------------------------------

    def snapshot(self, fleet: FleetSnapshot) -> Snapshot:
        """What the next decision reads: ``fleet`` with this replica's claims so far, now."""
        return Snapshot(fleet, self.view.pending_fn(fleet), self.clock.now())

    def decide(
        self, snapshot: Snapshot, request: CreateRequest, exclude: frozenset[str] = frozenset()
    ) -> Plan:
        """Filter, sample, score over ``snapshot``: the plan, or :class:`~corral.core.Refusal` (which
        filter turned each host away). Reads nothing else: no store, no clock, no view."""
        decision = self.placer(len(snapshot.fleet.hosts)).place(
            snapshot.fleet.hosts,
            request,
            now=snapshot.now,
            rng=self.rng,
            pending=snapshot.pending,
            exclude=exclude,
        )
        if self.config.strategy is Strategy.PACK:
            offered: tuple[str, ...] = (decision.host.id,)
        else:
            # Only candidates charged the same as the chosen one (same admission mode) share its charge.
            mode = decision.host.memory_admission
            offered = tuple(h.id for h in decision.candidates if h.memory_admission is mode)
        return Plan(request, decision, offered, Attempt(decision))

    # -- one sandbox -------------------------------------------------------------------------------

    async def place(self, start: Start, exclude: Collection[str] = ()) -> SandboxRecord:
        """Decide and apply until a host takes it: a host that says no is excluded and the next is
        tried; nothing left that fits is refused (after one fresh read: a cached absence is not a
        death), with why."""
        req = start.record.request()
        excluded = set(exclude)
        elsewhere: Counter[str] = Counter()  # why hosts that were tried did not take it
        reread = False
        attempts = 0
        explain = Explanation(req)
        fleet = await self.view.get()
        while True:
            try:
                plan = self.decide(self.snapshot(fleet), req, frozenset(excluded))
            except (NoCapacity, NoHealthyHosts) as refusal:
                if not reread:
                    reread = True
                    fleet = await self.view.get(fresh=True)
                    continue
                raise self.refused(refusal, fleet, elsewhere, explain) from None
            if attempts >= self.config.max_attempts:
                raise self.refused(NoCapacity({}, len(fleet.hosts)), fleet, elsewhere, explain)
            attempts += 1
            explain.tried(plan.attempt)
            self.metrics.view_age.observe(plan.decision.view_age_s)
            out = await self.apply(plan, start, fleet, explain)
            if isinstance(out, SandboxRecord):
                note(
                    outcome="placed",
                    host=out.host_id,
                    placer_choice=plan.host,
                    attempts=attempts,
                    view_age_s=round(plan.decision.view_age_s, 3),
                )
                return out
            excluded.update(out.hosts)
            start = replace(start, record=out.record)
            if out.reason is None:
                # Other replicas took the room since our read: read afresh.
                fleet = await self.view.get(fresh=True)
            else:
                elsewhere[out.reason] += 1

    async def apply(
        self, plan: Plan, start: Start, fleet: FleetSnapshot, explain: Explanation
    ) -> SandboxRecord | Rejected:
        """Reserve ``plan`` in the store, start it on the host the store took, write its record. The
        placed record, or which hosts to leave out next; whatever else goes wrong ends what this
        attempt took and is raised."""
        record = start.record
        req = plan.request
        # Claim locally before the first await, so this replica's concurrent decisions see it.
        claim = self.view.claim(plan.host, plan.charge_mb, req.cpu)
        try:
            res = await self.reserve(plan, record)
        except BaseException:
            claim.release()
            raise
        if res is None:
            claim.release()
            self.metrics.reserve_conflicts.inc()
            # Only what the store was offered had no room: packing offers its one choice.
            return Rejected(plan.offered, None, record)
        if res.host_id != plan.host:
            # The store's current totals preferred another of the candidates.
            claim.release()
            claim = self.view.claim(res.host_id, res.memory_mb, req.cpu)
        self.view.committed(claim)
        host_id, address = res.host_id, fleet.address(res.host_id)
        try:
            if record.state is SandboxState.RECREATING:
                record = await self._reassign(record, res, explain)
            return await self._bind(replace(start, record=record), host_id, address, res, explain)
        except BaseException as exc:
            if isinstance(exc, Exception) and not isinstance(exc, AgentRefusal):
                kept = await self._named_there(record, host_id)  # a recreate's: its new epoch
                if kept is not None:
                    note(outcome="placed", host=host_id, settled=True)
                    return kept
            # Whatever went wrong, nothing this attempt took may outlive it.
            if not isinstance(exc, AgentRefusal):
                await self.binder.stop_quietly(host_id, address, record.id)
            await self.cancel_quietly(res.id)
            claim.release()
            reason = elsewhere_reason(exc)
            if reason is None:
                if isinstance(exc, AgentError):
                    raise as_bad_gateway(host_id, exc) from exc
                raise
        plan.attempt.outcome(f"bind_refused:{reason}")
        self.metrics.agent_refusals.labels(host_id, reason).inc()
        return Rejected((host_id,), reason, record)

    async def reserve(self, plan: Plan, record: SandboxRecord) -> ReservationRecord | None:
        """The durable claim on one of the plan's offered hosts (None: none has the room now)."""
        kw = {
            "cpu": plan.request.cpu,
            "owner": self.config.replica_id,
            "ttl_s": self.config.timeouts.reservation_ttl_s,
            "sandbox_id": record.id,
        }
        if self.config.strategy is Strategy.PACK:
            res = await self.store.reserve(plan.host, memory_mb=plan.charge_mb, **kw)  # type: ignore[arg-type]
        else:
            res = await self.store.reserve_best(
                list(plan.offered),
                memory_mb=plan.charge_mb,
                image=plan.request.image,
                **kw,  # type: ignore[arg-type]
            )
        plan.attempt.offered(list(plan.offered))
        plan.attempt.took(res.host_id if res is not None else None)
        return res

    async def _reassign(
        self, record: SandboxRecord, res: ReservationRecord, explain: Explanation
    ) -> SandboxRecord:
        """A recreate's conditional write, before its start: from here the record names the new host
        and epoch, and every older copy is fenced."""
        return await self.store.reassign_sandbox(
            record.id,
            expect_version=record.version,
            host_id=res.host_id,
            reservation_id=res.id,
            placement=explain.to_json(),
        )

    async def _bind(
        self,
        start: Start,
        host_id: str,
        address: str,
        res: ReservationRecord,
        explain: Explanation,
        saturated_retries: int = 0,
    ) -> SandboxRecord:
        """Start it on the host, then write it ``running`` there if its record is as the placement left
        it. ``saturated_retries``: how often to ask again a host with too many starts in flight
        (a batch, whose reservation holds that host, waits; a single create tries another host)."""
        record = start.record
        pids = await self.templates.pids(record.template)
        image = await self.templates.image_config(record)
        for attempt in range(saturated_retries + 1):
            try:
                await self.binder.start(record, host_id, address, start.env, pids, start.secrets, image)
                break
            except AgentRefusal as e:
                if e.code != ErrorCode.HOST_STARTS_SATURATED or attempt == saturated_retries:
                    raise
                await asyncio.sleep(0.05 * (attempt + 1))
        explain.placed(host_id, res.id)
        if record.state is SandboxState.RECREATING:
            return await self.store.set_sandbox_state(
                record.id, SandboxState.RUNNING, expect=record.state, expect_version=record.version
            )
        try:
            return await self.store.set_sandbox_state(
                record.id,
                SandboxState.RUNNING,
                expect=record.state,
                host_id=host_id,
                reservation_id=res.id,
                placement=explain.to_json(),
            )
        except (StateConflict, RecordNotFound):
            if record.state is not SandboxState.RESERVED:
                raise
            return await self.resolved_meanwhile(record, res, start.key)

    async def resolved_meanwhile(
        self, record: SandboxRecord, res: ReservationRecord, key: tuple[str, str] | None
    ) -> SandboxRecord:
        """The record moved while this replica was starting it on ``res``'s host: the leader resolved
        it, this replica's lease having lapsed (a store out of reach, a process too busy to renew).
        Settled as running there at this epoch, the copy just started is the one it names. Settled as
        never made (no host listed it yet), it is written again as placed, unless the client's retry
        took its Idempotency-Key meanwhile. Otherwise the client asks again and gets the sandbox its
        key names now, or a fresh placement."""
        placed = replace(record, state=SandboxState.RUNNING, host_id=res.host_id, reservation_id=res.id)
        current = await self.store.get_sandbox(placed.id)
        named = placed.id  # the sandbox the client's key names now
        if current is None:
            try:
                out = await self.store.create_sandbox(
                    placed, idempotency_key=key[0] if key else None, request_hash=key[1] if key else None
                )
            except StoreError:
                pass  # over quota or its name taken by now: the retry decides afresh
            else:
                if not out.replayed:
                    note(outcome="placed_again", sandbox_id=placed.id)
                    return out.record
                named = out.record.id
        elif current.state is SandboxState.DELETED:
            raise ResourceNotFound(f"sandbox {placed.id} was deleted while it was being placed")
        elif _names_copy(current, placed.host_id, placed.epoch):
            return current
        raise Unavailable(
            f"this create was settled while its replica's lease had lapsed ({placed.id}); ask again",
            code=ErrorCode.CREATE_IN_PROGRESS,
            retry_after_s=1,
            details={"sandbox_id": named},
        )

    async def _named_there(self, record: SandboxRecord, host_id: str) -> SandboxRecord | None:
        """After a bind that may have started the copy on ``host_id`` failed without an answer (a
        timeout, a lost reply): the record, if it now names that copy as running. The leader resolved
        it so while this replica's lease had lapsed, or this create's own last write landed
        unanswered: the copy is the sandbox, and stopping it to place again would lose it. None
        otherwise, or when the store cannot be asked."""
        with contextlib.suppress(Exception):
            current = await self.store.get_sandbox(record.id)
            if current is not None and _names_copy(current, host_id, record.epoch):
                return current
        return None

    # -- a batch -----------------------------------------------------------------------------------

    async def apply_all(
        self,
        plans: Sequence[Plan],
        starts: Sequence[Start],
        fleet: FleetSnapshot,
        explains: Sequence[Explanation],
    ) -> list[SandboxRecord] | None:
        """Reserve every plan in one store transaction (None: the store took none of them, as some
        host's room went meanwhile), then start each, at most ``PER_HOST_STARTS`` at once per host.
        All or nothing: if any cannot start, every member that may have started is stopped and every
        claim ends."""
        cfg = self.config
        for plan in plans:
            # A batch reserves exactly the hosts its decisions chose.
            plan.attempt.offered([plan.host])
            plan.attempt.took(plan.host)
        items = [
            ReserveItem(p.host, p.charge_mb, p.request.cpu, s.record.id)
            for p, s in zip(plans, starts, strict=True)
        ]
        reserved = await self.store.reserve_batch(
            items, owner=cfg.replica_id, ttl_s=cfg.timeouts.reservation_ttl_s
        )
        if reserved is None:
            self.metrics.reserve_conflicts.inc()
            return None
        claims = [self.view.claim(r.host_id, r.memory_mb, r.cpu) for r in reserved]
        for c in claims:
            self.view.committed(c)
        gates: dict[str, asyncio.Semaphore] = defaultdict(lambda: asyncio.Semaphore(PER_HOST_STARTS))

        async def bind(start: Start, res: ReservationRecord, explain: Explanation) -> SandboxRecord:
            async with gates[res.host_id]:
                return await self._bind(
                    start, res.host_id, fleet.address(res.host_id), res, explain, SATURATED_RETRIES
                )

        results = await asyncio.gather(
            *(bind(s, r, e) for s, r, e in zip(starts, reserved, explains, strict=True)),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return [r for r in results if isinstance(r, SandboxRecord)]
        for start, res in zip(starts, reserved, strict=True):
            await self.binder.stop_quietly(res.host_id, fleet.address(res.host_id), start.record.id)
            await self.cancel_quietly(res.id)
        for c in claims:
            c.release()
        reasons = Counter(r for r in map(elsewhere_reason, failures) if r is not None)
        if len(reasons) == len(failures) or (
            not reasons and all(isinstance(f, AgentError) for f in failures)
        ):
            raise self.refused(NoCapacity({}, len(fleet.hosts)), fleet, reasons)
        raise failures[0]

    # -- endings -----------------------------------------------------------------------------------

    def refused(
        self,
        refusal: Refusal,
        fleet: FleetSnapshot,
        extra: Counter[str],
        explain: Explanation | None = None,
    ) -> Unavailable:
        """The 503 of a placement nothing took: counted by reason, with what was checked and why."""
        reasons = Counter(refusal.reasons)
        reasons.update(extra)
        code = refusal.code
        self.metrics.refusals.labels(code).inc()
        details: dict[str, object] = {"checked": refusal.checked, "reasons": dict(reasons)}
        note(outcome=code, reasons=dict(reasons))
        if explain is not None:
            explain.refused(refusal, code, dict(reasons))
            details["placement"] = explain.as_dict()
        parts = ", ".join(f"{n} {r}" for r, n in reasons.most_common())
        msg = f"{len(fleet.hosts)} hosts: {parts}" if parts else f"{len(fleet.hosts)} hosts"
        retry = self.retry_after.estimate(code, fleet)
        return Unavailable(msg, code=code, retry_after_s=retry, details=details)

    async def cancel_quietly(self, reservation_id: str) -> None:
        """End a claim at once. If the store cannot be told now, the replica's lease or the
        reservation's TTL ends it."""
        with contextlib.suppress(Exception):
            await self.store.cancel(reservation_id)
