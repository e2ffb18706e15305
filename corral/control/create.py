"""The create flow, steps 1-8: record (quota, name, idempotency) -> view -> filter, sample,
score -> durable reserve -> bind on the agent -> confirm -> or refuse honestly.

Every exit path ends what it started: a reservation is cancelled the moment its bind fails, a sandbox
record that was never placed is removed, so a refused create leaves nothing behind and a retry with the
same Idempotency-Key starts clean. A reservation that outlives this process (crash) ends with this
replica's lease, or at its hard TTL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Collection, Iterator, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

from corral.agent.errors import AgentError, AgentRefusal
from corral.codes import ErrorCode
from corral.control.binding import Binder, as_bad_gateway, elsewhere_reason
from corral.control.config import ControlConfig
from corral.control.errors import Conflict, InvalidRequest, ResourceNotFound, TenantOverQuota, Unavailable
from corral.control.explain import Attempt, Explanation
from corral.control.metrics import Metrics
from corral.control.pools import WarmClaims
from corral.control.ports import AgentLookup, CreatePort
from corral.control.retry import RetryAfter
from corral.control.seal import Sealer, Spec

if TYPE_CHECKING:
    from corral.control.waiting import WaitingCreates
from corral.control.view import FleetSnapshot, ViewCache
from corral.core import (
    Clock,
    CreateRequest,
    Decision,
    FullScan,
    NoCapacity,
    NoHealthyHosts,
    Placer,
    PowerOfK,
    Refusal,
    Scorer,
    Strategy,
    candidate_limit,
    oversize,
)
from corral.ids import new_sandbox_id
from corral.logs import note
from corral.store import (
    FAILOVER_ORPHAN,
    FAILOVER_RECREATE,
    IdempotencyMismatch,
    NameConflict,
    QuotaExceeded,
    RecordNotFound,
    ReservationRecord,
    SandboxRecord,
    SandboxState,
    StateConflict,
    StoreError,
    TemplateRecord,
    from_millicores,
    to_millicores,
)

# What placement does on the chosen host once its reservation is held: (host, address, reservation,
# explanation) -> the record as placed.
Commit = Callable[[str, str, ReservationRecord, Explanation], Awaitable[SandboxRecord]]

TEMPLATE_CACHE_S = 5.0
FIRST_REFUSALS_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class CreateSpec:
    template: str = "default"
    memory_mb: int | None = None
    cpus: float | None = None
    stateful: bool | None = None
    ttl_seconds: float | None = None
    name: str | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    # Delivered to the sandbox like env, never echoed, kept only sealed. Not part of the fingerprint
    # (a hash of a short secret in the store could be guessed): only their names are.
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    failover: str | None = None  # None: the template's
    # Seconds it may wait for capacity (parked in ``waiting_capacity``) instead of being refused.
    wait_s: float | None = None

    def fingerprint(self) -> str:
        """What an Idempotency-Key is bound to: the same key with another body is a client bug."""
        body = asdict(self)
        body["metadata"] = dict(self.metadata)
        body["env"] = dict(self.env)
        body["secrets"] = sorted(self.secrets)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _names_copy(current: SandboxRecord, host_id: str | None, epoch: int) -> bool:
    """Whether the store's record now says the copy on ``host_id`` at ``epoch`` is the sandbox, running."""
    return current.state is SandboxState.RUNNING and current.host_id == host_id and current.epoch == epoch


class CreateFlow:
    def __init__(
        self,
        store: CreatePort,
        view: ViewCache,
        agents: AgentLookup,
        config: ControlConfig,
        clock: Clock,
        rng: random.Random,
        metrics: Metrics,
        retry_after: RetryAfter,
    ) -> None:
        self.store = store
        self.view = view
        self.agents = agents
        self.config = config
        self.clock = clock
        self.rng = rng
        self.metrics = metrics
        self.retry_after = retry_after
        self.binder = Binder(agents, config.timeouts.bind_timeout_s)
        self._placers: dict[int, Placer] = {}
        self._templates: dict[str, tuple[TemplateRecord, float]] = {}
        # Idempotency keys refused at least once, with when: "time from first refusal to success".
        self._first_refusal: dict[str, float] = {}
        # The warm-pool claim a create tries first (set by the control plane).
        self.warm: WarmClaims | None = None
        # Seals each sandbox's spec into its record (set by the control plane when it has a key).
        self.sealer: Sealer | None = None
        # Parks a create that may wait for capacity (set by the control plane).
        self.waiting: WaitingCreates | None = None

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

    # -- step 1: the record ----------------------------------------------------------------------

    async def _template(self, name: str) -> TemplateRecord | None:
        """Templates change rarely and are read on every create: cache what exists, briefly."""
        now = self.clock.now()
        hit = self._templates.get(name)
        if hit is not None and hit[1] > now:
            return hit[0]
        tpl = await self.store.get_template(name)
        if tpl is not None:
            self._templates[name] = (tpl, now + TEMPLATE_CACHE_S)
        return tpl

    async def pids_of(self, template: str) -> int | None:
        """The pids limit a sandbox of ``template`` runs with (None: the runtime's default)."""
        tpl = await self._template(template)
        return tpl.pids if tpl is not None else None

    async def _resolve(self, spec: CreateSpec, tpl: TemplateRecord | None = None) -> tuple[int, float, bool]:
        tpl = tpl or await self._template(spec.template)
        if tpl is None:
            raise InvalidRequest("template", f"unknown template {spec.template!r}")
        memory_mb = spec.memory_mb if spec.memory_mb is not None else tpl.memory_mb
        if memory_mb < self.config.min_memory_mb:
            raise InvalidRequest(
                "memory_mb", f"memory_mb: at least {self.config.min_memory_mb} MiB, got {memory_mb}"
            )
        cpu_m = to_millicores(spec.cpus if spec.cpus is not None else tpl.cpus)
        if cpu_m < 1:
            raise InvalidRequest("cpus", "cpus: at least 0.001 (CPU is counted in millicores)")
        cpus = from_millicores(cpu_m)  # as the tenant's quota counts it
        stateful = spec.stateful if spec.stateful is not None else tpl.stateful
        await self._check_size(memory_mb, cpus)
        return memory_mb, cpus, stateful

    async def _check_size(self, memory_mb: int, cpus: float) -> None:
        """A request larger than every host is the caller's mistake, never a wait for capacity: 422
        before any record is written (no quota taken, nothing parked). With no host known, the create
        goes on and is refused as ``no_healthy_hosts``."""
        req = CreateRequest(memory_mb=memory_mb, cpu=cpus)
        snap = await self.view.get()
        if oversize(snap.hosts, req, self.placer(len(snap.hosts)).roles) is None:
            return
        snap = await self.view.get(fresh=True)  # a larger host may have joined since the cached read
        over = oversize(snap.hosts, req, self.placer(len(snap.hosts)).roles)
        if over is not None:
            asked = cpus if over.field == "cpus" else memory_mb
            err = InvalidRequest(
                over.field, f"{over.field}: {asked:g} is more than the largest host has ({over.largest:g})"
            )
            err.details["largest_host"] = over.largest
            raise err

    async def draft(
        self, tenant_id: str, spec: CreateSpec, tpl: TemplateRecord | None = None
    ) -> SandboxRecord:
        """The record a create writes, before it is written (``tpl``: the template, if known)."""
        tpl = tpl or await self._template(spec.template)
        memory_mb, cpus, stateful = await self._resolve(spec, tpl)
        failover = spec.failover or (tpl.failover if tpl is not None else FAILOVER_ORPHAN)
        now = self.clock.now()
        sandbox_id = new_sandbox_id(now)
        sealed = None
        if failover == FAILOVER_RECREATE or spec.secrets:
            if self.sealer is None:
                field_name = "secrets" if spec.secrets else "failover"
                raise InvalidRequest(field_name, f"{field_name}: this control plane has no seal key")
            sealed = self.sealer.seal(sandbox_id, Spec(env=dict(spec.env), secrets=dict(spec.secrets)))
        elif self.sealer is not None and spec.env:
            # Nothing to keep, nothing sealed: a sandbox without a sealed spec starts with an empty one.
            sealed = self.sealer.seal(sandbox_id, Spec(env=dict(spec.env), secrets={}))
        return SandboxRecord(
            id=sandbox_id,
            tenant_id=tenant_id,
            template=spec.template,
            memory_mb=memory_mb,
            cpus=cpus,
            stateful=stateful,
            name=spec.name,
            metadata=dict(spec.metadata),
            expires_at=now + spec.ttl_seconds if spec.ttl_seconds else None,
            failover=failover,
            sealed_spec=sealed,
            owner=self.config.replica_id,
        )

    async def new_record(
        self, tenant_id: str, spec: CreateSpec, idempotency_key: str | None, request_hash: str | None = None
    ) -> tuple[SandboxRecord, bool]:
        record = await self.draft(tenant_id, spec)
        if idempotency_key and request_hash is None:
            request_hash = spec.fingerprint()
        with self.store_errors(spec, tenant_id):
            out = await self.store.create_sandbox(
                record,
                idempotency_key=idempotency_key,
                request_hash=request_hash if idempotency_key else None,
            )
        return out.record, out.replayed

    @contextlib.contextmanager
    def store_errors(self, spec: CreateSpec, tenant_id: str) -> Iterator[None]:
        """The store's refusals of a create, as the API answers them."""
        try:
            yield
        except NameConflict as e:
            raise Conflict(f"a sandbox named {spec.name!r} exists", details={"field": "name"}) from e
        except IdempotencyMismatch as e:
            raise InvalidRequest(
                "Idempotency-Key", "this Idempotency-Key was used with another request body"
            ) from e
        except QuotaExceeded as e:
            self.metrics.refusals.labels(TenantOverQuota.code).inc()
            raise TenantOverQuota(
                str(e),
                details={"limit": e.limit, "allowed": e.allowed, "used": e.used, "requested": e.requested},
            ) from e
        except RecordNotFound as e:
            raise ResourceNotFound(f"unknown tenant {tenant_id}") from e

    # -- the whole flow ----------------------------------------------------------------------------

    async def create(
        self, tenant_id: str, spec: CreateSpec, *, idempotency_key: str | None = None
    ) -> tuple[SandboxRecord, bool]:
        """Place one sandbox. Returns (record, replayed)."""
        started = self.clock.now()
        if spec.wait_s is not None:
            if self.waiting is None or self.sealer is None:
                raise InvalidRequest("wait_s", "wait_s: this control plane does not park creates")
            self.waiting.check(spec.wait_s)
        if self.warm is not None:
            claimed = await self._claim_warm(tenant_id, spec, idempotency_key)
            if claimed is not None:
                if not claimed[1]:
                    self.observe_success(claimed[0], started, tenant_id, idempotency_key)
                return claimed
        key = (idempotency_key, spec.fingerprint()) if idempotency_key else None
        record, replayed = await self.new_record(tenant_id, spec, idempotency_key, key[1] if key else None)
        if replayed:
            note(outcome="replayed", sandbox_id=record.id)
            return await self._replay(record), True
        if spec.wait_s is not None and self.waiting is not None and await self.waiting.queued(tenant_id):
            # Creates of this tenant already wait: this one goes behind them, not past them.
            placed = await self._park(record, spec.wait_s, idempotency_key)
            self.observe_success(placed, started, tenant_id, idempotency_key)
            return placed, False
        try:
            placed = await self._place_and_bind(record, dict(spec.env), spec.secrets, key)
        except BaseException as exc:
            if not (isinstance(exc, Unavailable) and spec.wait_s is not None and self.waiting is not None):
                await self.forget_failed(record)
                if isinstance(exc, Unavailable) and idempotency_key:
                    if len(self._first_refusal) >= FIRST_REFUSALS_KEPT:  # bounded: forget the oldest
                        del self._first_refusal[next(iter(self._first_refusal))]
                    self._first_refusal.setdefault(f"{tenant_id}/{idempotency_key}", started)
                raise
            placed = await self._park(record, spec.wait_s, idempotency_key)
        self.observe_success(placed, started, tenant_id, idempotency_key)
        return placed, False

    async def _park(self, record: SandboxRecord, wait_s: float, idempotency_key: str | None) -> SandboxRecord:
        """Nothing fits now and the caller may wait: the record stays, parked, for the leader to place.
        Once parked, only its deadline, or its client leaving without a key, ends it."""
        assert self.waiting is not None
        try:
            parked = await self.waiting.park(record, wait_s)
        except BaseException:
            await self.forget(record)
            raise
        note(outcome="parked", sandbox_id=record.id)
        return await self.waiting.wait(parked, idempotency_key)

    async def _claim_warm(
        self, tenant_id: str, spec: CreateSpec, idempotency_key: str | None
    ) -> tuple[SandboxRecord, bool] | None:
        """A create of a pooled template that asks for nothing its warm sandboxes were not admitted
        with takes one of them; None: place it cold."""
        assert self.warm is not None
        if await self.warm.book.get(spec.template) is None:
            return None
        # The pools' templates are read with the pools: no template read per claim, however many.
        tpl = self.warm.book.templates.get(spec.template)
        if tpl is None:
            return None
        if spec.secrets:
            # A warm sandbox keeps its claim's environment on the host's disk: secrets start cold.
            self.warm.miss(spec.template, "secrets")
            return None
        if not self.warm.eligible_spec(tpl, spec.memory_mb, spec.cpus, spec.stateful):
            self.warm.miss(spec.template, "override")
            return None
        record = await self.draft(tenant_id, spec, tpl)
        with self.store_errors(spec, tenant_id):
            claimed = await self.warm.claim(
                record,
                spec.env,
                idempotency_key=idempotency_key,
                request_hash=spec.fingerprint() if idempotency_key else None,
            )
        if claimed is None:
            return None
        if claimed.replayed:
            return await self._replay(claimed.record), True
        return claimed.record, False

    async def _replay(self, first: SandboxRecord) -> SandboxRecord:
        """What a repeated Idempotency-Key answers: the sandbox the first call made, as it is now."""
        current = await self.store.get_sandbox(first.id, tenant_id=first.tenant_id)
        if current is None or current.state is SandboxState.DELETED:
            raise ResourceNotFound(f"the sandbox this Idempotency-Key created, {first.id}, has been deleted")
        if current.state is SandboxState.WAITING_CAPACITY and self.waiting is not None:
            # Parked by the first call (on this replica or one that died): wait with it.
            return await self.waiting.wait(current, "attached")
        if current.state is SandboxState.RESERVED:
            # The first call is still placing it: ask again in a moment, and get its outcome.
            raise Unavailable(
                f"a create with this Idempotency-Key is in progress ({first.id})",
                code=ErrorCode.CREATE_IN_PROGRESS,
                retry_after_s=1,
                details={"sandbox_id": first.id},
            )
        return current

    async def spec_of(self, rec: SandboxRecord) -> Spec:
        """The sandbox's env and secrets, unsealed (empty when it has no sealed spec)."""
        sealed = await self.store.sealed_spec(rec.id)
        if sealed is None or self.sealer is None:
            return Spec(env={}, secrets={})
        return self.sealer.open(rec.id, sealed)

    def observe_success(
        self, placed: SandboxRecord, started: float, tenant_id: str, idempotency_key: str | None
    ) -> None:
        host = placed.host_id or ""
        latency = max(0.0, self.clock.now() - started)
        self.metrics.placed(host, latency)
        note(sandbox_id=placed.id, create_ms=round(latency * 1000, 2))
        if idempotency_key:
            first = self._first_refusal.pop(f"{tenant_id}/{idempotency_key}", None)
            if first is not None:
                self.metrics.refusal_to_success.observe(max(0.0, self.clock.now() - first))

    async def forget(self, record: SandboxRecord, expect: SandboxState | None = None) -> None:
        """Remove a record that was never placed, and its idempotency key with it, so that a retry
        with the same key creates anew; with ``expect``, only if it is still in that state. Best
        effort: the store may be the thing that failed (the reconciler settles a record left behind)."""
        with contextlib.suppress(Exception):
            await self.store.delete_sandbox(record.id, forget_idempotency=True, expect=expect)

    async def forget_failed(self, record: SandboxRecord) -> None:
        """After a create failed: its record goes while unplaced, or while running as this create's own
        commit wrote it (the failure came after that write landed: a cancelled request, or a lost reply
        when the store could not be asked again; placement already stopped the copy). A record the
        leader settled as running on a host, this replica's lease having lapsed, stays: the client's
        retry gets that sandbox."""
        with contextlib.suppress(Exception):
            current = await self.store.get_sandbox(record.id)
            if current is None:
                return
            if current.state is SandboxState.RESERVED:
                await self.forget(record, SandboxState.RESERVED)
            elif current.state is SandboxState.RUNNING and current.reservation_id is not None:
                await self.forget(record, SandboxState.RUNNING)

    def refused(
        self,
        refusal: Refusal,
        snap: FleetSnapshot,
        extra: Counter[str],
        explain: Explanation | None = None,
    ) -> Unavailable:
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
        msg = f"{len(snap.hosts)} hosts: {parts}" if parts else f"{len(snap.hosts)} hosts"
        retry = self.retry_after.estimate(code, snap)
        return Unavailable(
            msg,
            code=code,
            retry_after_s=retry,
            details=details,
        )

    async def _place_and_bind(
        self,
        record: SandboxRecord,
        env: dict[str, str],
        secrets: Mapping[str, str],
        key: tuple[str, str] | None = None,
    ) -> SandboxRecord:
        return await self.place(record, self.bind(record, SandboxState.RESERVED, env, secrets, key))

    def bind(
        self,
        record: SandboxRecord,
        expect: SandboxState,
        env: Mapping[str, str],
        secrets: Mapping[str, str],
        key: tuple[str, str] | None = None,
    ) -> Commit:
        """Start it on the chosen host, then record it ``running`` there if it is still ``expect``.
        ``key``: the create's Idempotency-Key and request fingerprint."""

        async def commit(
            host_id: str, address: str, res: ReservationRecord, explain: Explanation
        ) -> SandboxRecord:
            await self.binder.start(
                record, host_id, address, env, await self.pids_of(record.template), secrets
            )
            explain.placed(host_id, res.id)
            try:
                return await self.store.set_sandbox_state(
                    record.id,
                    SandboxState.RUNNING,
                    expect=expect,
                    host_id=host_id,
                    reservation_id=res.id,
                    placement=explain.to_json(),
                )
            except (StateConflict, RecordNotFound):
                if expect is not SandboxState.RESERVED:
                    raise
                return await self.settled_meanwhile(record, res, key)

        return commit

    async def settled_meanwhile(
        self, record: SandboxRecord, res: ReservationRecord, key: tuple[str, str] | None
    ) -> SandboxRecord:
        """The record moved while this replica was starting it on ``res``'s host: the leader settled
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

    async def place(
        self, record: SandboxRecord, commit: Commit, exclude: Collection[str] = ()
    ) -> SandboxRecord:
        """Placement as every sandbox gets it (a create, a recreate after failover): filter, sample,
        score, reserve in the store, then ``commit`` on the chosen host; a host that says no is
        excluded and the next is tried. Whatever ``commit`` raises ends what this attempt took."""
        cfg = self.config
        req = CreateRequest(memory_mb=record.memory_mb, cpu=record.cpus, stateful=record.stateful)
        exclude = set(exclude)
        elsewhere: Counter[str] = Counter()  # why hosts that were tried did not take it
        reread = False
        attempts = 0
        explain = Explanation(req)
        snap = await self.view.get()
        while True:
            try:
                decision = self.placer(len(snap.hosts)).place(
                    snap.hosts,
                    req,
                    now=self.clock.now(),
                    rng=self.rng,
                    pending=self.view.pending_fn(snap),
                    exclude=frozenset(exclude),
                )
            except (NoCapacity, NoHealthyHosts) as refusal:
                if not reread:
                    # A cached absence is not a death: read the source once before refusing.
                    reread = True
                    snap = await self.view.get(fresh=True)
                    continue
                raise self.refused(refusal, snap, elsewhere, explain) from None
            if attempts >= cfg.max_attempts:
                raise self.refused(NoCapacity({}, len(snap.hosts)), snap, elsewhere, explain)
            attempts += 1
            attempt = explain.decided(decision)
            self.metrics.view_age.observe(decision.view_age_s)
            # Claim locally before the first await, so this replica's concurrent decisions see it.
            claim = self.view.claim(decision.host.id, decision.charge_mb, req.cpu)
            try:
                res = await self._reserve(decision, req, record, attempt)
            except BaseException:
                claim.release()
                raise
            if res is None:
                # Other replicas took the room since our read: drop these hosts, read afresh.
                claim.release()
                self.metrics.reserve_conflicts.inc()
                exclude.update(h.id for h in decision.candidates)
                snap = await self.view.get(fresh=True)
                continue
            if res.host_id != decision.host.id:
                # The store's current totals preferred another of the candidates.
                claim.release()
                claim = self.view.claim(res.host_id, res.memory_mb, req.cpu)
            self.view.committed(claim)
            host_id, address = res.host_id, snap.address(res.host_id)
            try:
                placed = await commit(host_id, address, res, explain)
                note(
                    outcome="placed",
                    host=host_id,
                    placer_choice=decision.host.id,
                    attempts=attempts,
                    view_age_s=round(decision.view_age_s, 3),
                )
                return placed
            except BaseException as exc:
                if isinstance(exc, Exception) and not isinstance(exc, AgentRefusal):
                    kept = await self._named_there(record, host_id)
                    if kept is not None:
                        note(outcome="placed", host=host_id, attempts=attempts, settled=True)
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
            elsewhere[reason] += 1
            attempt.outcome(f"bind_refused:{reason}")
            self.metrics.agent_refusals.labels(host_id, reason).inc()
            exclude.add(host_id)

    async def _named_there(self, record: SandboxRecord, host_id: str) -> SandboxRecord | None:
        """After a bind that may have started the copy on ``host_id`` failed without an answer (a
        timeout, a lost reply): the record, if it now names that copy as running. The leader settled
        it so while this replica's lease had lapsed, or this create's own last write landed
        unanswered: the copy is the sandbox, and stopping it to place again would lose it. None
        otherwise, or when the store cannot be asked."""
        with contextlib.suppress(Exception):
            current = await self.store.get_sandbox(record.id)
            if current is not None and _names_copy(current, host_id, record.epoch):
                return current
        return None

    async def _reserve(
        self, decision: Decision, req: CreateRequest, record: SandboxRecord, attempt: Attempt | None = None
    ) -> ReservationRecord | None:
        """The durable claim. Spreading, the store chooses among the sampled candidates by its current
        totals (replicas see each other's in-flight work at commit); packing, it is the chosen host."""
        t = self.config.timeouts
        kw = {
            "cpu": req.cpu,
            "owner": self.config.replica_id,
            "ttl_s": t.reservation_ttl_s,
            "sandbox_id": record.id,
        }
        if self.config.strategy is Strategy.PACK:
            candidates = [decision.host.id]
            res = await self.store.reserve(decision.host.id, memory_mb=decision.charge_mb, **kw)  # type: ignore[arg-type]
        else:
            # Only candidates charged the same as the chosen one (same admission mode) share its charge.
            mode = decision.host.memory_admission
            candidates = [h.id for h in decision.candidates if h.memory_admission is mode]
            res = await self.store.reserve_best(candidates, memory_mb=decision.charge_mb, **kw)  # type: ignore[arg-type]
        if attempt is not None:
            attempt.offered(candidates)
            attempt.took(res.host_id if res is not None else None)
        return res

    async def cancel_quietly(self, reservation_id: str) -> None:
        """End a claim at once. If the store cannot be told now, the replica's lease or the
        reservation's TTL ends it."""
        with contextlib.suppress(Exception):
            await self.store.cancel(reservation_id)
