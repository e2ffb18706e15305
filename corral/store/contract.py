"""The store contract: records, errors and the abstract ``Store`` every backend implements.

The store is corral's consistency boundary: name uniqueness,
idempotency keys, capacity reservations and ownership changes each go through one transaction here, so
any number of API replicas can decide at once without double-booking a host. Everything else
(heartbeat freshness, sampling, metrics) is decided by the caller from what the store returns.

Times are epoch seconds (float) from the store's injected clock, never the database server's: tests
drive expiry with ``ManualClock``, and replicas compare times they themselves wrote.

Memory amounts handed to ``reserve*`` are *charges* already computed by the caller with
:func:`corral.core.admission.request_charge_mb`; the store's capacity condition,
``memory_mb_admittable - reserved_mb >= charge``, is :func:`corral.core.admission.fits` with that charge,
evaluated where two deciders cannot both pass it.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from corral.codes import ErrorCode
from corral.core.types import DEFAULT_SANDBOX_PIDS, AdmissionMode, HostState, HostView, Pending

# -- errors ----------------------------------------------------------------------------------------


class StoreError(Exception):
    """Base of every error the store raises. ``code`` is stable: the API maps it to a response."""

    code: str = ErrorCode.STORE_ERROR


class StoreUnavailable(StoreError):
    """The state of record cannot be reached (refused, timed out, server gone). Retryable: the
    backend reconnects by itself when the server is back."""

    code = ErrorCode.STORE_UNAVAILABLE


class NotFound(StoreError):
    code = ErrorCode.NOT_FOUND


class NameConflict(StoreError):
    """A name already taken in its scope (a live sandbox name in its tenant; a tenant or template)."""

    code = ErrorCode.NAME_CONFLICT


class IdempotencyMismatch(StoreError):
    """The same idempotency key was sent again with a different request body."""

    code = ErrorCode.IDEMPOTENCY_KEY_REUSED


class OverQuota(StoreError):
    """The tenant's own limit. ``limit`` names which: ``max_sandboxes`` or ``max_memory_mb``."""

    code = ErrorCode.TENANT_OVER_QUOTA

    def __init__(self, limit: str, allowed: int, used: int, requested: int) -> None:
        self.limit = limit
        self.allowed = allowed
        self.used = used
        self.requested = requested
        super().__init__(f"{limit}: {used} used + {requested} requested > {allowed} allowed")


class StateConflict(StoreError):
    """A compare-and-set lost: the sandbox is no longer in the expected state (or version)."""

    code = ErrorCode.STATE_CONFLICT

    def __init__(self, sandbox_id: str, current: SandboxState, version: int) -> None:
        self.sandbox_id = sandbox_id
        self.current = current
        self.version = version
        super().__init__(f"sandbox {sandbox_id} is {current.value} (version {version})")


class HostBusy(StoreError):
    """A host cannot be forgotten while sandboxes are live on it."""

    code = ErrorCode.HOST_HAS_SANDBOXES


class TokenRevoked(StoreError):
    """A configured token that was revoked: it is never adopted again."""

    code = ErrorCode.TOKEN_REVOKED


class InvalidRecord(StoreError, ValueError):
    """Input the store refuses before touching anything (negative memory, unknown state, ...)."""

    code = ErrorCode.INVALID_REQUEST


# -- enums -----------------------------------------------------------------------------------------


class SandboxState(enum.StrEnum):
    """``reserved -> starting -> running -> stopped | deleted``; ``waiting_capacity`` for work parked
    after a transient refusal (never ``failed`` for a 503); ``orphaned`` when its host died (410 until
    the host returns and reclaims it, or an operator deletes it); ``failed`` for permanent errors."""

    RESERVED = "reserved"
    STARTING = "starting"
    RUNNING = "running"
    STOPPED = "stopped"
    DELETED = "deleted"
    WAITING_CAPACITY = "waiting_capacity"
    ORPHANED = "orphaned"
    FAILED = "failed"
    # Its host died (or is drained with evacuation) and it is being started elsewhere from its spec.
    RECREATING = "recreating"


# What happens to a sandbox when its host dies: started again elsewhere under its id, or orphaned.
FAILOVER_RECREATE = "recreate"
FAILOVER_ORPHAN = "orphan"
FAILOVER_POLICIES = (FAILOVER_RECREATE, FAILOVER_ORPHAN)


# States that hold a tenant's quota (and would hold host memory if placed).
LIVE_STATES: frozenset[SandboxState] = frozenset(
    {
        SandboxState.RESERVED,
        SandboxState.STARTING,
        SandboxState.RUNNING,
        SandboxState.WAITING_CAPACITY,
        SandboxState.ORPHANED,
        SandboxState.RECREATING,
    }
)


class Role(enum.StrEnum):
    ADMIN = "admin"
    TENANT = "tenant"
    AGENT = "agent"


class _Unset(enum.Enum):
    UNSET = enum.auto()


# "Leave this field as it is" (None is a value: it clears the field).
UNSET = _Unset.UNSET


# -- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What an agent reports. ``seq`` must increase strictly across the agent's whole life, restarts
    included (seed it from wall-clock milliseconds at start): a heartbeat whose seq is not newer than
    the stored one is a delayed packet and is ignored."""

    host_id: str
    seq: int
    cpu_total: float
    cpu_used: float
    memory_mb_total: int
    memory_mb_used: int
    memory_mb_admittable: int
    memory_admission: AdmissionMode = AdmissionMode.WORKING_SET
    # None: the host accepts any template.
    templates: frozenset[str] | None = None
    runtime: str = "sim"
    gpu: str | None = None
    role: str = "worker"
    stream_restore: bool = False
    # The sandboxes the agent's admittable already accounts for.
    sandbox_ids: frozenset[str] = frozenset()
    # The agent's base URL; empty for in-process agents.
    address: str = ""
    # Warm sandboxes per template: (ready, starting). They are not in ``sandbox_ids``: no record
    # claims them and none ever will until one is claimed.
    warm: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Sparse: the epoch of every entry of ``sandbox_ids`` whose epoch is not 0.
    epochs: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class HostRecord:
    """A host as the store holds it: its last accepted heartbeat plus what only the store knows
    (drain state, outstanding live reservations)."""

    id: str
    heartbeat_at: float
    cpu_total: float
    cpu_used: float
    memory_mb_total: int
    memory_mb_used: int
    memory_mb_admittable: int
    memory_admission: AdmissionMode
    templates: frozenset[str] | None
    runtime: str
    gpu: str | None
    role: str
    state: HostState
    stream_restore: bool
    sandbox_ids: frozenset[str]
    seq: int
    registered_at: float
    address: str
    # Live (unexpired) reservations on this host: capacity promised that no heartbeat shows yet.
    reserved_mb: int
    reserved_cpu: float
    # Warm sandboxes per template as the last heartbeat said: (ready, starting).
    warm: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def warm_ready(self, template: str) -> int:
        return self.warm.get(template, (0, 0))[0]

    def view(self) -> HostView:
        return HostView(
            id=self.id,
            heartbeat_at=self.heartbeat_at,
            cpu_total=self.cpu_total,
            cpu_used=self.cpu_used,
            memory_mb_total=self.memory_mb_total,
            memory_mb_used=self.memory_mb_used,
            memory_mb_admittable=self.memory_mb_admittable,
            memory_admission=self.memory_admission,
            templates=self.templates,
            runtime=self.runtime,
            gpu=self.gpu,
            role=self.role,
            state=self.state,
            stream_restore=self.stream_restore,
        )

    def pending(self) -> Pending:
        return Pending(self.reserved_mb, self.reserved_cpu)


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    host: HostRecord
    # False: the heartbeat's seq was not newer than the stored one; nothing changed.
    accepted: bool
    # Reservations this heartbeat confirmed (ended) because it shows their sandboxes.
    confirmed: int
    # Sandboxes this host runs at an epoch that is no longer theirs: it must stop them now.
    fenced: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class FailedHost:
    """What :meth:`Store.fail_host` did, in one transaction."""

    orphaned: int
    recreating: int
    released: int


@dataclass(frozen=True, slots=True)
class ReserveItem:
    """One entry of a batch reservation."""

    host_id: str
    memory_mb: int
    cpu: float = 0.0
    sandbox_id: str | None = None


@dataclass(frozen=True, slots=True)
class ReservationRecord:
    id: str
    host_id: str
    memory_mb: int
    cpu: float
    owner: str
    sandbox_id: str | None
    created_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class SandboxRecord:
    id: str
    tenant_id: str
    template: str
    memory_mb: int
    cpus: float
    state: SandboxState = SandboxState.RESERVED
    name: str | None = None
    host_id: str | None = None
    stateful: bool = False
    metadata: Mapping[str, str] = field(default_factory=dict)
    created_at: float = 0.0  # set by the store on create
    updated_at: float = 0.0  # set by the store on every write
    expires_at: float | None = None  # the sandbox's own TTL (the reaper's), not a reservation's
    reservation_id: str | None = None
    # Bumped on every write: a fencing token (an old owner's compare-and-set cannot pass).
    version: int = 0
    oom_kills: int = 0  # processes the kernel's OOM killer killed in it, as its host last reported
    # Claimed from a warm pool rather than started for this create.
    warm: bool = False
    failover: str = FAILOVER_ORPHAN
    # Bumped each time the sandbox is given a new host: only the copy of the current epoch may run.
    epoch: int = 0
    recreated_at: float | None = None
    # A create parked in ``waiting_capacity``: placed by the leader until then, refused after.
    wait_until: float | None = None
    # Its spec (env, secrets) sealed; written with the record, read only to start it. Never listed.
    sealed_spec: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class CreateOutcome:
    record: SandboxRecord
    # True: the idempotency key had been seen; this is the first call's sandbox, nothing was created.
    replayed: bool


class Page(NamedTuple):
    items: list[SandboxRecord]
    # Opaque; pass it back as ``cursor`` for the next page. None: this was the last page.
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class TenantRecord:
    id: str
    name: str
    max_sandboxes: int
    max_memory_mb: int
    created_at: float


@dataclass(frozen=True, slots=True)
class Usage:
    """What a tenant's live sandboxes (``LIVE_STATES``) hold against its quota."""

    sandboxes: int
    memory_mb: int


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a token speaks for. ``tenant_id`` is None for agent tokens; ``host_id`` names the one host
    an agent token speaks for (None: a fleet-wide development token)."""

    token_id: str
    tenant_id: str | None
    role: Role
    host_id: str | None = None


@dataclass(frozen=True, slots=True)
class TokenRecord:
    """A stored token, without its secret (only a hash of it is kept)."""

    id: str
    role: Role
    tenant_id: str | None
    host_id: str | None
    source: str | None
    created_at: float


@dataclass(frozen=True, slots=True)
class HostCredentials:
    """What enrolling a host hands out, once: the token its agent presents to the control plane and
    the key the control plane presents to its agent."""

    host_id: str
    agent_token: str
    host_key: str


@dataclass(frozen=True, slots=True)
class TemplateRecord:
    name: str
    cpus: float
    memory_mb: int
    stateful: bool = False
    runtime: str | None = None
    description: str = ""
    created_at: float = 0.0
    pids: int = DEFAULT_SANDBOX_PIDS  # the most processes (threads included) a sandbox may run
    failover: str = FAILOVER_ORPHAN  # the default of its sandboxes' failover policy


@dataclass(frozen=True, slots=True)
class PoolRecord:
    """A warm pool: the intent to keep ``size`` sandboxes of ``template`` booted and unowned, spread as
    per-host ``targets`` (written by the leader), at most ``max_per_host`` on one host."""

    template: str
    size: int
    max_per_host: int | None = None
    targets: Mapping[str, int] = field(default_factory=dict)
    created_at: float = 0.0
    updated_at: float = 0.0


# -- the contract ----------------------------------------------------------------------------------


class Store(ABC):
    """The state of record. Every method is one transaction (or one statement) of the backend; every
    "cannot reach the database" failure surfaces as :class:`StoreUnavailable`."""

    # -- lifecycle -----------------------------------------------------------------------------

    @abstractmethod
    async def migrate(self) -> int:
        """Apply the versioned schema; idempotent and safe when several replicas start at once.
        Returns the schema version now in place."""

    @abstractmethod
    async def ping(self) -> None:
        """Readiness: returns if the store answers, raises :class:`StoreUnavailable` otherwise."""

    @abstractmethod
    async def close(self) -> None: ...

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- hosts ---------------------------------------------------------------------------------

    @abstractmethod
    async def register_host(self, host_id: str, *, address: str = "", role: str = "worker") -> HostRecord:
        """Create a host row before its first heartbeat (no capacity, ``heartbeat_at`` 0, so it is
        stale and never placed on), or update the address of a known one."""

    @abstractmethod
    async def upsert_heartbeat(self, hb: Heartbeat) -> HeartbeatResult:
        """Register or refresh a host from its heartbeat, stamped with the store's clock.

        Ignored (``accepted=False``) when ``hb.seq`` is not newer than the stored seq. When accepted,
        the same transaction confirms (ends) every reservation on the host whose ``sandbox_id`` is in
        ``hb.sandbox_ids``: the published admittable now counts that sandbox, so its reservation must
        stop being subtracted. A heartbeat never changes the drain state."""

    @abstractmethod
    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None:
        """Raise the ``oom_kills`` of each listed sandbox on ``host_id`` to its count (a count never
        goes down: heartbeats may arrive late or twice). Sandboxes on other hosts are left alone."""

    @abstractmethod
    async def drain(self, host_id: str) -> HostRecord:
        """Stop new reservations on the host (``state=draining``); raises :class:`NotFound`."""

    @abstractmethod
    async def undrain(self, host_id: str) -> HostRecord: ...

    @abstractmethod
    async def delete_host(self, host_id: str) -> bool:
        """Forget a host and end its reservations. Its sandbox records stay (a host's death never
        deletes a placement). True if it existed."""

    @abstractmethod
    async def get_host(self, host_id: str) -> HostRecord | None: ...

    @abstractmethod
    async def list_hosts(self) -> list[HostRecord]:
        """Every host, ordered by id, with live reservation totals (for the view cache)."""

    # -- reservations --------------------------------------------------------------------------

    @abstractmethod
    async def reserve(
        self,
        host_id: str,
        *,
        memory_mb: int,
        cpu: float = 0.0,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None = None,
    ) -> ReservationRecord | None:
        """Reserve ``memory_mb`` (a charge) on a ready host if its admittable minus its live
        reservations covers it. None: no room (or no such host, or draining). Race-proof across
        processes and replicas; expired reservations never count against the room."""

    @abstractmethod
    async def reserve_best(
        self,
        candidates: Sequence[str],
        *,
        memory_mb: int,
        cpu: float = 0.0,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None = None,
    ) -> ReservationRecord | None:
        """Among ``candidates`` (the K sampled hosts), reserve on the ready one with the most room by
        the store's *current* reserved totals, so replicas see each other's in-flight work at
        commit. The record's ``host_id`` says which host it took. None: none of them has room."""

    @abstractmethod
    async def reserve_batch(
        self, items: Sequence[ReserveItem], *, owner: str, ttl_s: float
    ) -> list[ReservationRecord] | None:
        """All or nothing, in one transaction: every item reserved (in order), or none and None.
        Several items may name the same host; their sum must fit."""

    @abstractmethod
    async def confirm(self, reservation_id: str) -> bool:
        """End a reservation because its sandbox is placed and accounted for. True if this call
        ended it (each reservation ends exactly once)."""

    @abstractmethod
    async def cancel(self, reservation_id: str) -> bool:
        """End a reservation because its placement failed. Never touches a sandbox record (a late
        rollback after a successful place is harmless). True if this call ended it."""

    @abstractmethod
    async def get_reservation(self, reservation_id: str) -> ReservationRecord | None:
        """The reservation if it has not ended (an expired, unswept one is returned; check
        ``expires_at``)."""

    @abstractmethod
    async def sweep_expired(self) -> int:
        """End every reservation past its ``expires_at``. Returns how many ended."""

    @abstractmethod
    async def drop_owner(self, owner: str) -> int:
        """End every reservation held by ``owner`` (a replica that died). Returns how many ended."""

    @abstractmethod
    async def outstanding(self) -> dict[str, Pending]:
        """Live reserved memory and cpu per host, for every host that has any (idle fleet: {})."""

    @abstractmethod
    async def next_expiry(self) -> float | None:
        """When the earliest live reservation expires (for an honest Retry-After); None if none."""

    @abstractmethod
    async def audit(self) -> list[str]:
        """Check the books: per host, the stored reserved totals equal the sum of its reservation
        rows and are not negative. Returns one line per discrepancy; [] when consistent."""

    # -- leases --------------------------------------------------------------------------------

    @abstractmethod
    async def renew_replica(self, replica_id: str, ttl_s: float) -> float:
        """Keep a replica alive; returns its lease's new expiry. A reservation's ``owner`` is the
        replica id: when the lease lapses, ``expire_replicas`` ends its reservations."""

    @abstractmethod
    async def release_replica(self, replica_id: str) -> int:
        """A clean shutdown: drop the lease and end the replica's reservations (how many)."""

    @abstractmethod
    async def expire_replicas(self) -> list[str]:
        """End every reservation of each replica whose lease lapsed, forget those leases, and return
        their ids."""

    @abstractmethod
    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the single-leader lease ``name`` (e.g. "reconciler"). Re-entrant for its
        holder; anyone may take it over once it has expired."""

    @abstractmethod
    async def resign(self, name: str, holder: str) -> bool:
        """Give the lease up if ``holder`` has it. True if it did."""

    # -- sandboxes -----------------------------------------------------------------------------

    @abstractmethod
    async def create_sandbox(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome:
        """In one transaction: idempotency lookup (a repeated key of the tenant returns the first
        sandbox, ``replayed=True``; the same key with another ``request_hash`` raises
        :class:`IdempotencyMismatch`), name uniqueness among the tenant's sandboxes that are not
        ``deleted`` (:class:`NameConflict`), the tenant's quota over ``LIVE_STATES``
        (:class:`OverQuota`; :class:`NotFound` for an unknown tenant), then the insert.
        ``created_at``/``updated_at``/``version`` are set by the store."""

    @abstractmethod
    async def check_create(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome | None:
        """The checks of ``create_sandbox`` (same errors, same replay outcome) as a read, inserting
        nothing: a create that is about to take something it cannot give back (a warm sandbox)
        learns first whether it would be refused. ``create_sandbox`` checks again atomically."""

    @abstractmethod
    async def purge_idempotency_keys(self, older_than: float) -> int:
        """Forget idempotency keys first used before ``older_than`` (epoch seconds); a retry after
        that creates anew. Returns how many were forgotten."""

    @abstractmethod
    async def set_sandbox_state(
        self,
        sandbox_id: str,
        state: SandboxState,
        *,
        expect: SandboxState | Collection[SandboxState] | None = None,
        expect_version: int | None = None,
        host_id: str | _Unset | None = UNSET,
        reservation_id: str | _Unset | None = UNSET,
        placement: str | _Unset | None = UNSET,
    ) -> SandboxRecord:
        """Compare-and-set: move the sandbox to ``state`` (and, when given, set its owner host,
        reservation and placement explanation, a JSON text) only if it is currently in ``expect`` and
        at ``expect_version``; two deciders cannot both move it. Raises :class:`StateConflict` on a
        lost race, :class:`NotFound`."""

    @abstractmethod
    async def fail_host(self, host_id: str, dead_before: float, *, evacuate: bool = False) -> FailedHost:
        """In one transaction, if the host is still silent (its last heartbeat before ``dead_before``):
        its running recreate-policy sandboxes become ``recreating``, its other running ones
        ``orphaned``, and its reservations are released. With ``evacuate`` and the host draining, only
        the first step, whether it is silent or not."""

    @abstractmethod
    async def reassign_sandbox(
        self, sandbox_id: str, *, expect_version: int, host_id: str, reservation_id: str, placement: str
    ) -> SandboxRecord:
        """One conditional write: a ``recreating`` sandbox at ``expect_version`` gets ``host_id`` and its
        epoch plus one, and every other host that may hold an older copy is fenced. Raises
        :class:`StateConflict` when another decider moved it first."""

    @abstractmethod
    async def park_sandbox(self, sandbox_id: str, wait_until: float) -> SandboxRecord:
        """A ``reserved`` record no host took becomes ``waiting_capacity`` until ``wait_until``
        (:class:`StateConflict` if it is no longer ``reserved``)."""

    @abstractmethod
    async def sealed_spec(self, sandbox_id: str) -> str | None:
        """The sandbox's sealed spec (None: it has none)."""

    @abstractmethod
    async def sealed_specs(self, after_id: str, limit: int) -> list[tuple[str, str]]:
        """(id, sealed spec) of sandboxes with one, by id after ``after_id``."""

    @abstractmethod
    async def replace_sealed_spec(self, sandbox_id: str, old: str, new: str) -> bool:
        """Compare-and-set of a sealed spec (re-sealing under a new key)."""

    @abstractmethod
    async def host_activity(self, since: float) -> dict[str, tuple[int, int]]:
        """Per host: (sandboxes placed there created at or after ``since``, configured MiB of its live
        sandboxes). What an operator's view shows beside each host's heartbeat."""

    @abstractmethod
    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None:
        """The placement explanation (JSON text) kept with the sandbox, or None when none was kept.
        Raises :class:`NotFound` when the sandbox does not exist (or is another tenant's)."""

    @abstractmethod
    async def set_sandbox_expiry(self, sandbox_id: str, expires_at: float | None) -> SandboxRecord:
        """Set (or clear) the sandbox's own TTL deadline."""

    @abstractmethod
    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        """The sandbox, or None. With ``tenant_id``, another tenant's sandbox is None too."""

    @abstractmethod
    async def list_sandboxes(
        self,
        *,
        tenant_id: str | None = None,
        host_id: str | None = None,
        state: SandboxState | Collection[SandboxState] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """Filtered, ordered by (created_at, id); keyset pagination with an opaque, stable cursor.
        ``limit`` is 1..1000. A bad cursor raises :class:`InvalidRecord`."""

    @abstractmethod
    async def delete_sandbox(self, sandbox_id: str, *, forget_idempotency: bool = False) -> bool:
        """Remove the record (its name becomes free). True if it existed. ``forget_idempotency``: a
        create that was refused leaves no trace, so its key, retried, creates anew."""

    @abstractmethod
    async def expired_sandboxes(self, now: float | None = None, *, limit: int = 100) -> list[SandboxRecord]:
        """Live sandboxes whose ``expires_at`` has passed (``now`` defaults to the store's clock),
        earliest first, for the TTL reaper."""

    # -- tenants, tokens, quotas ---------------------------------------------------------------

    @abstractmethod
    async def create_tenant(self, name: str, *, max_sandboxes: int, max_memory_mb: int) -> TenantRecord:
        """Raises :class:`NameConflict` if the name is taken."""

    @abstractmethod
    async def get_tenant(self, tenant_id: str) -> TenantRecord | None: ...

    @abstractmethod
    async def get_tenant_by_name(self, name: str) -> TenantRecord | None: ...

    @abstractmethod
    async def list_tenants(self) -> list[TenantRecord]: ...

    @abstractmethod
    async def set_quota(self, tenant_id: str, *, max_sandboxes: int, max_memory_mb: int) -> TenantRecord: ...

    @abstractmethod
    async def usage(self, tenant_id: str) -> Usage: ...

    @abstractmethod
    async def issue_token(self, tenant_id: str | None, role: Role) -> str:
        """A new random token; only its hash is stored, so the plaintext is returned once, here."""

    @abstractmethod
    async def ensure_token(self, plaintext: str, tenant_id: str | None, role: Role) -> Principal:
        """Store a given token (from configuration at start-up); idempotent. Raises
        :class:`NameConflict` if the token is already stored for another tenant or role, and
        :class:`TokenRevoked` if it was revoked."""

    @abstractmethod
    async def resolve_token(self, plaintext: str) -> Principal | None: ...

    @abstractmethod
    async def revoke_token(self, token_id: str) -> bool:
        """Delete the token and advance the revocation epoch. True if it existed."""

    @abstractmethod
    async def adopt_token(
        self, plaintext: str, tenant_id: str | None, role: Role, *, source: str
    ) -> Principal:
        """Store a configured token as ``source``'s, revoking every other token of that role and
        source (a server restarted with another token leaves the previous one dead)."""

    @abstractmethod
    async def list_tokens(self, *, tenant_id: str | None = None) -> list[TokenRecord]:
        """Every stored token (or a tenant's), oldest first, without secrets."""

    @abstractmethod
    async def auth_epoch(self) -> int:
        """A counter that grows with every revocation (revoke, re-enrolment, forgetting a host)."""

    @abstractmethod
    async def fleet_secret(self, name: str) -> str:
        """The random secret ``name`` that every replica shares: made by the first caller, the same
        for every later one (on any replica, after any restart)."""

    # -- host identity -------------------------------------------------------------------------

    @abstractmethod
    async def enrol_host(self, host_id: str) -> HostCredentials:
        """Create the host's record if new, and give it fresh credentials: its previous agent
        tokens and key are revoked, and its ``seq`` starts over (in one transaction)."""

    @abstractmethod
    async def host_key(self, host_id: str) -> str | None:
        """The key the control plane presents to ``host_id``'s agent; None if not enrolled."""

    @abstractmethod
    async def forget_host(self, host_id: str) -> bool:
        """Delete the host, its reservations and its credentials. Raises :class:`HostBusy` while a
        live sandbox is on it. True if there was anything to forget."""

    # -- templates -----------------------------------------------------------------------------

    @abstractmethod
    async def create_template(self, template: TemplateRecord) -> TemplateRecord:
        """Raises :class:`NameConflict` if it exists. The built-in ``default`` (1 cpu, 512 MiB, not
        stateful) exists on every migrated store."""

    @abstractmethod
    async def get_template(self, name: str) -> TemplateRecord | None: ...

    @abstractmethod
    async def list_templates(self) -> list[TemplateRecord]: ...

    @abstractmethod
    async def delete_template(self, name: str) -> bool: ...

    # -- warm pools ----------------------------------------------------------------------------

    @abstractmethod
    async def create_pool(self, template: str, *, size: int, max_per_host: int | None = None) -> PoolRecord:
        """Raises :class:`NameConflict` if the template already has a pool, :class:`NotFound` if the
        template does not exist."""

    @abstractmethod
    async def update_pool(
        self, template: str, *, size: int | None = None, max_per_host: int | _Unset | None = UNSET
    ) -> PoolRecord:
        """Change a pool's size or per-host cap; raises :class:`NotFound`."""

    @abstractmethod
    async def delete_pool(self, template: str) -> bool:
        """Forget the pool and its targets. True if it existed."""

    @abstractmethod
    async def list_pools(self) -> list[PoolRecord]:
        """Every pool with its per-host targets, ordered by template."""

    @abstractmethod
    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool:
        """Replace the pool's per-host targets (hosts with 0 are dropped). False if the pool is gone."""


def as_states(value: SandboxState | Collection[SandboxState] | None) -> frozenset[SandboxState] | None:
    """Normalise an ``expect``/``state`` filter argument."""
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset({SandboxState(value)})
    return frozenset(SandboxState(v) for v in value)


def metadata_dict(value: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}
