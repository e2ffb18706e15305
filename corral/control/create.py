"""The create flow: step 1 (the spec resolved, the record written under quota, name and
Idempotency-Key), a warm claim, then the placement step (:mod:`corral.control.placement`: view ->
filter, sample, score -> durable reserve -> bind on the agent -> confirm -> or refuse honestly), or
parked to wait for capacity.

Every exit path ends what it started: a reservation is cancelled the moment its bind fails, a sandbox
record that was never placed is removed, so a refused create leaves nothing behind and a retry with the
same Idempotency-Key starts clean. A reservation that outlives this process (crash) ends with this
replica's lease, or at its hard TTL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import KW_ONLY, asdict, dataclass, field, replace

from corral.codes import ErrorCode
from corral.control.config import ControlConfig
from corral.control.errors import Conflict, InvalidRequest, ResourceNotFound, TenantOverQuota, Unavailable
from corral.control.fairgate import CreateTurn, FairGate
from corral.control.metrics import Metrics
from corral.control.network import checked, network_text
from corral.control.placement import Placement, Start
from corral.control.pools import WarmClaims
from corral.control.ports import CreatePort
from corral.control.rates import TenantRates
from corral.control.readiness import Readiness
from corral.control.seal import Sealer, Spec, open_spec
from corral.control.templates import Templates
from corral.control.view import ViewCache
from corral.control.waiting import WaitingCreates
from corral.core import Clock, CreateRequest, oversize
from corral.core.types import DEFAULT_SANDBOX_DISK_MB, DEFAULT_TEMPLATE
from corral.ids import new_sandbox_id
from corral.logs import note
from corral.store import (
    FAILOVER_ORPHAN,
    FAILOVER_RECREATE,
    IdempotencyMismatch,
    NameConflict,
    QuotaExceeded,
    RecordNotFound,
    SandboxRecord,
    SandboxState,
    TemplateRecord,
    from_millicores,
    to_millicores,
)

FIRST_REFUSALS_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class CreateSpec:
    template: str = DEFAULT_TEMPLATE
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
    disk_mb: int | None = None  # its own disk over its template's image; None: the template's
    # Its egress policy's wire form (corral.core.netpolicy); None: mode "none", loopback only.
    network: Mapping[str, object] | None = None
    # What its timeout does (corral.core.lifecycle's text; None: it is killed). E2B's create sets it.
    lifecycle: str | None = None

    def record(
        self,
        sandbox_id: str,
        tenant_id: str,
        *,
        memory_mb: int,
        cpus: float,
        stateful: bool,
        failover: str,
        now: float,
        owner: str | None,
        image: str | None = None,
        disk_mb: int | None = None,
        network: str | None = None,
    ) -> SandboxRecord:
        """The record this spec writes, its sizes and failover resolved against its template. Its env
        and secrets are not on the record: they are sealed into it (:meth:`contents`), and ``wait_s``
        is given when it is parked."""
        return SandboxRecord(
            id=sandbox_id,
            tenant_id=tenant_id,
            template=self.template,
            memory_mb=memory_mb,
            cpus=cpus,
            stateful=stateful,
            name=self.name,
            metadata=dict(self.metadata),
            expires_at=now + self.ttl_seconds if self.ttl_seconds else None,
            failover=failover,
            owner=owner,
            image=image,
            disk_mb=disk_mb,
            network=network,
            lifecycle=self.lifecycle,
        )

    def contents(self) -> Spec:
        """What is sealed of it, and what its host starts it with beyond its record."""
        return Spec(env=dict(self.env), secrets=dict(self.secrets))

    def fingerprint(self) -> str:
        """What an Idempotency-Key is bound to: the same key with another body is a client bug."""
        body = asdict(self)
        body["metadata"] = dict(self.metadata)
        body["env"] = dict(self.env)
        body["secrets"] = sorted(self.secrets)
        for later in (
            "disk_mb",
            "network",
            "lifecycle",
        ):  # keys given before these existed keep their fingerprint
            if body[later] is None:
                del body[later]
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(eq=False, repr=False)
class CreateFlow:
    """A create as the client asks it: its spec resolved against the template, its record written
    (quota, name, Idempotency-Key), a warm claim tried first, then the placement step; parked when
    nothing fits and the caller may wait."""

    store: CreatePort
    view: ViewCache
    placement: Placement
    templates: Templates
    config: ControlConfig
    clock: Clock
    metrics: Metrics
    _: KW_ONLY
    # The warm-pool claim a create tries first.
    warm: WarmClaims | None = None
    # Seals each sandbox's spec into its record (when this control plane has a key).
    sealer: Sealer | None = None
    # Parks a create that may wait for capacity.
    waiting: WaitingCreates | None = None
    # Each tenant's create rate (None: unbounded), and the creates worked on at once, by turns.
    rates: TenantRates | None = None
    # Runs a sandbox's template's start command and waits for its ready check (set by the plane).
    ready: Readiness | None = None
    gate: FairGate = field(init=False)
    # Idempotency keys refused at least once, with when: "time from first refusal to success".
    _first_refusal: dict[str, float] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.gate = FairGate(self.config.max_creates_in_flight)

    # -- step 1: the record ----------------------------------------------------------------------

    async def _resolve(self, spec: CreateSpec, tpl: TemplateRecord | None) -> tuple[int, float, bool]:
        if tpl is None:
            raise InvalidRequest("template", f"unknown template {spec.template!r}")
        memory_mb = spec.memory_mb if spec.memory_mb is not None else tpl.memory_mb
        self.config.check_memory(memory_mb)
        cpu_m = to_millicores(spec.cpus if spec.cpus is not None else tpl.cpus)
        if cpu_m < 1:
            raise InvalidRequest("cpus", "cpus: at least 0.001 (CPU is counted in millicores)")
        cpus = from_millicores(cpu_m)  # as the tenant's quota counts it
        stateful = spec.stateful if spec.stateful is not None else tpl.stateful
        await self._check_size(CreateRequest(memory_mb=memory_mb, cpu=cpus))  # before there is a record
        return memory_mb, cpus, stateful

    async def _check_size(self, req: CreateRequest) -> None:
        """A request larger than every host is the caller's mistake, never a wait for capacity: 422
        before any record is written (no quota taken, nothing parked). With no host known, the create
        goes on and is refused as ``no_healthy_hosts``."""
        snap = await self.view.get()
        if oversize(snap.hosts, req, self.placement.placer(len(snap.hosts)).roles) is None:
            return
        snap = await self.view.get(fresh=True)  # a larger host may have joined since the cached read
        over = oversize(snap.hosts, req, self.placement.placer(len(snap.hosts)).roles)
        if over is not None:
            asked = req.cpu if over.field == "cpus" else req.memory_mb
            err = InvalidRequest(
                over.field, f"{over.field}: {asked:g} is more than the largest host has ({over.largest:g})"
            )
            err.details["largest_host"] = over.largest
            raise err

    async def draft(
        self, tenant_id: str, spec: CreateSpec, tpl: TemplateRecord | None = None
    ) -> SandboxRecord:
        """The record a create writes, before it is written (``tpl``: the template, if known)."""
        tpl = tpl or await self.templates.get(spec.template)
        memory_mb, cpus, stateful = await self._resolve(spec, tpl)
        failover = spec.failover or (tpl.failover if tpl is not None else FAILOVER_ORPHAN)
        image, disk_mb = _disk(spec, tpl)
        network = network_text(checked(spec.network))
        now = self.clock.now()
        record = spec.record(
            new_sandbox_id(now),
            tenant_id,
            memory_mb=memory_mb,
            cpus=cpus,
            stateful=stateful,
            failover=failover,
            now=now,
            owner=self.config.replica_id,
            image=image,
            disk_mb=disk_mb,
            network=network,
        )
        sealed = self._seal(record.id, spec, failover)
        return record if sealed is None else replace(record, sealed_spec=sealed)

    def _seal(self, sandbox_id: str, spec: CreateSpec, failover: str) -> str | None:
        """The spec sealed into the record: what a recreate or a parked create starts from later."""
        if failover == FAILOVER_RECREATE or spec.secrets:
            if self.sealer is None:
                field_name = "secrets" if spec.secrets else "failover"
                raise InvalidRequest(field_name, f"{field_name}: this control plane has no seal key")
            return self.sealer.seal(sandbox_id, spec.contents())
        if self.sealer is not None and spec.env:
            # Nothing to keep, nothing sealed: a sandbox without a sealed spec starts with an empty one.
            return self.sealer.seal(sandbox_id, spec.contents())
        return None

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
            if self.rates is not None:
                self.rates.refused(tenant_id, TenantOverQuota.code)
            raise TenantOverQuota(
                str(e),
                details={"limit": e.limit, "allowed": e.allowed, "used": e.used, "requested": e.requested},
            ) from e
        except RecordNotFound as e:
            raise ResourceNotFound(f"unknown tenant {tenant_id}") from e

    # -- the whole flow ----------------------------------------------------------------------------

    def admit(self, tenant_id: str, count: int = 1) -> None:
        """The tenant's create rate, paid before anything is read or written (a refusal costs nothing)."""
        if self.rates is not None:
            self.rates.take(tenant_id, count)

    async def create(
        self, tenant_id: str, spec: CreateSpec, *, idempotency_key: str | None = None
    ) -> tuple[SandboxRecord, bool]:
        """Place one sandbox. Returns (record, replayed)."""
        started = self.clock.now()
        if spec.wait_s is not None:
            if self.waiting is None or self.sealer is None:
                raise InvalidRequest("wait_s", "wait_s: this control plane does not park creates")
            self.waiting.check(spec.wait_s)
        self.admit(tenant_id)
        async with self.gate.slot(tenant_id) as slot:
            record, replayed = await self._create(tenant_id, spec, idempotency_key, started, slot)
        if self.ready is not None:
            await (self.ready.replayed(record) if replayed else self.ready.settle(record))
        return record, replayed

    async def _create(
        self, tenant_id: str, spec: CreateSpec, idempotency_key: str | None, started: float, slot: CreateTurn
    ) -> tuple[SandboxRecord, bool]:
        if self.warm is not None:
            claimed = await self._claim_warm(tenant_id, spec, idempotency_key, slot)
            if claimed is not None:
                if not claimed[1]:
                    self.observe_success(claimed[0], started, tenant_id, idempotency_key)
                return claimed
        key = (idempotency_key, spec.fingerprint()) if idempotency_key else None
        record, replayed = await self.new_record(tenant_id, spec, idempotency_key, key[1] if key else None)
        if replayed:
            note(outcome="replayed", sandbox_id=record.id)
            return await self._replay(record, slot), True
        if spec.wait_s is not None and self.waiting is not None and await self.waiting.queued(tenant_id):
            # Creates of this tenant already wait: this one goes behind them, not past them.
            placed = await self._park(record, spec.wait_s, idempotency_key, slot)
            self.observe_success(placed, started, tenant_id, idempotency_key)
            return placed, False
        try:
            placed = await self.placement.place(Start.of(record, spec.contents(), key))
        except BaseException as exc:
            if not (isinstance(exc, Unavailable) and spec.wait_s is not None and self.waiting is not None):
                await self.forget_failed(record)
                if isinstance(exc, Unavailable) and idempotency_key:
                    if len(self._first_refusal) >= FIRST_REFUSALS_KEPT:  # bounded: forget the oldest
                        del self._first_refusal[next(iter(self._first_refusal))]
                    self._first_refusal.setdefault(f"{tenant_id}/{idempotency_key}", started)
                raise
            placed = await self._park(record, spec.wait_s, idempotency_key, slot)
        self.observe_success(placed, started, tenant_id, idempotency_key)
        return placed, False

    async def _park(
        self, record: SandboxRecord, wait_s: float, idempotency_key: str | None, slot: CreateTurn
    ) -> SandboxRecord:
        """Nothing fits now and the caller may wait: the record stays, parked, for the leader to place.
        Once parked, only its deadline, or its client leaving without a key, ends it. The wait holds
        no create slot: the leader places it."""
        assert self.waiting is not None
        try:
            parked = await self.waiting.park(record, wait_s)
        except BaseException:
            await self.forget(record)
            raise
        note(outcome="parked", sandbox_id=record.id)
        slot.release()
        return await self.waiting.wait(parked, idempotency_key)

    async def _claim_warm(
        self, tenant_id: str, spec: CreateSpec, idempotency_key: str | None, slot: CreateTurn
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
            return await self._replay(claimed.record, slot), True
        return claimed.record, False

    async def _replay(self, first: SandboxRecord, slot: CreateTurn | None = None) -> SandboxRecord:
        """What a repeated Idempotency-Key answers: the sandbox the first call made, as it is now."""
        current = await self.store.get_sandbox(first.id, tenant_id=first.tenant_id)
        if current is None or current.state is SandboxState.DELETED:
            raise ResourceNotFound(f"the sandbox this Idempotency-Key created, {first.id}, has been deleted")
        if current.state is SandboxState.WAITING_CAPACITY and self.waiting is not None:
            # Parked by the first call (on this replica or one that died): wait with it, slot given back.
            if slot is not None:
                slot.release()
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

    async def unsealed_spec(self, rec: SandboxRecord) -> Spec:
        """The sandbox's env and secrets, unsealed (empty when it has no sealed spec)."""
        return await open_spec(self.store, self.sealer, rec.id)

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
        effort: the store may be the thing that failed (the reconciler resolves a record left behind)."""
        with contextlib.suppress(Exception):
            await self.store.delete_sandbox(record.id, forget_idempotency=True, expect=expect)

    async def forget_failed(self, record: SandboxRecord) -> None:
        """After a create failed: its record goes while unplaced, or while running as this create's own
        commit wrote it (the failure came after that write landed: a cancelled request, or a lost reply
        when the store could not be asked again; placement already stopped the copy). A record the
        leader resolved as running on a host, this replica's lease having lapsed, stays: the client's
        retry gets that sandbox."""
        with contextlib.suppress(Exception):
            current = await self.store.get_sandbox(record.id)
            if current is None:
                return
            if current.state is SandboxState.RESERVED:
                await self.forget(record, SandboxState.RESERVED)
            elif current.state is SandboxState.RUNNING and current.reservation_id is not None:
                await self.forget(record, SandboxState.RUNNING)


def _disk(spec: CreateSpec, tpl: TemplateRecord | None) -> tuple[str | None, int | None]:
    """The image a sandbox's root is made of and its own disk's size: a sandbox of an image always has
    a disk (the template's size, the create's override, else the default); one without an image has
    no writable layer to size (its writable places are memory, counted against its limit)."""
    image = tpl.image if tpl is not None else None
    if image is None:
        if spec.disk_mb is not None:
            raise InvalidRequest("disk_mb", "disk_mb: only for a template with an image")
        return None, None
    disk_mb = spec.disk_mb if spec.disk_mb is not None else tpl.disk_mb if tpl is not None else None
    return image, disk_mb if disk_mb is not None else DEFAULT_SANDBOX_DISK_MB
