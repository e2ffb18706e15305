"""The store contract: the abstract ``Store`` every backend implements, one protocol per aggregate
(hosts, reservations, leases, sandboxes, failover, access, templates) and their union.
Records live in ``records``, errors in ``errors``.

Each method is declared once, here. An aggregate is the union of the faces its callers take (the view
cache reads ``HostReader``, a heartbeat writes through ``HeartbeatSink``, ...): a flow depends on the
faces it calls, and :mod:`corral.control.ports` combines them into what each flow asks for. The SQL
stores subclass ``Store``; the in-memory model (:mod:`corral.testing.store`) subclasses the faces
that check their input here (a record, a claim, a state change, a page: each method checks, then
calls its backend's ``_..._checked``) and satisfies the others structurally.

The store is corral's consistency boundary: name uniqueness, idempotency keys, capacity reservations
and ownership changes each go through one transaction here, so any number of API replicas can decide
at once without double-booking a host. Everything else
(heartbeat freshness, sampling, metrics) is decided by the caller from what the store returns.

Times are epoch seconds (float) from the store's injected clock, never the database server's: tests
drive expiry with ``ManualClock``, and replicas compare times they themselves wrote.

Memory amounts handed to ``reserve*`` are *charges* already computed by the caller with
:func:`corral.core.admission.request_charge_mb`; the store's capacity condition is
:func:`corral.core.admission.host_fits` of a ready host (memory and CPU, on the store's live reserved
totals) with that charge, rendered from the core's one declaration (:mod:`corral.store.fit`) and
evaluated where two deciders cannot both pass it.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

from corral.core.types import Pending
from corral.shapes.hosts import HostCredentials
from corral.store import rows
from corral.store.records import (
    DEFAULT_MAX_CPUS,
    MAX_SUMMARIES,
    UNSET,
    ChangeRecord,
    CreateOutcome,
    DomainRecord,
    FailedHost,
    HeartbeatResult,
    HostRecord,
    HostReport,
    ListingChange,
    Page,
    PageQuery,
    PoolRecord,
    Principal,
    ReservationRecord,
    ReserveItem,
    Role,
    SandboxRecord,
    SandboxState,
    SandboxSummary,
    StateChange,
    TemplateRecord,
    TenantRecord,
    TokenRecord,
    Usage,
    _Unset,
    check_page,
    check_pool,
    check_reservation,
    check_sandbox,
    check_state_change,
    check_template,
)


class HostReader(Protocol):
    """The fleet as the view cache reads it."""

    @abstractmethod
    async def list_hosts(self) -> list[HostRecord]:
        """Every host, ordered by id, with live reservation totals (for the view cache)."""


class HeartbeatSink(Protocol):
    """What an agent's heartbeat writes: its host's facts and listing, and the OOM kills it saw."""

    @abstractmethod
    async def upsert_heartbeat(self, hb: HostReport) -> HeartbeatResult:
        """Register or refresh a host from its heartbeat, stamped with the store's clock.

        Ignored (``accepted=False``) when ``hb.seq`` is not newer than the stored seq. When accepted:
        a whole listing replaces the host's; changes apply only if ``listing.base`` is the seq of the
        listing the store holds and the digest they fold to is the one the agent sent (otherwise the
        store's listing is kept, or marked untrusted on a digest mismatch, and ``listed_seq`` in the
        result tells the agent to send its whole set). The same transaction confirms (ends) every
        outstanding reservation on the host whose sandbox the host now lists: the published
        admittable counts that sandbox, so its reservation must stop being subtracted. A heartbeat
        never changes the drain state."""

    @abstractmethod
    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None:
        """Raise the ``oom_kills`` of each listed sandbox on ``host_id`` to its count (a count never
        goes down: heartbeats may arrive late or twice). Sandboxes on other hosts are left alone."""


class Listings(Protocol):
    """What hosts' heartbeats said they run, as the store holds it: read by what changed since a
    time, never whole, and forgotten once the reconciler has seen entries go."""

    @abstractmethod
    async def listing_disputes(self, since: float) -> list[ListingChange]:
        """Of :meth:`listing_changes`, those whose sandbox's record disputes them
        (:func:`corral.store.records.disputed`): what the reconciler must look at again."""

    @abstractmethod
    async def listed(self, host_id: str, sandbox_ids: Collection[str]) -> dict[str, int]:
        """Of ``sandbox_ids``, those ``host_id``'s listing holds, with their epochs."""

    @abstractmethod
    async def listed_hosts(self, sandbox_ids: Collection[str]) -> dict[str, str]:
        """Sandbox id -> a host whose listing holds it, for those of ``sandbox_ids`` some host lists."""

    @abstractmethod
    async def prune_listings(self, before: float) -> int:
        """Forget entries that went out of listings before ``before`` (kept until then so the
        reconciler sees them go). Returns how many."""


class CommittedMemory(Protocol):
    """Memory promised fleet-wide, from counters."""

    @abstractmethod
    async def committed_mb(self) -> int:
        """Memory promised to every live sandbox (``LIVE_STATES``), from the tenants' usage counters:
        a read per tenant, never per sandbox."""


class HostStore(HostReader, HeartbeatSink, Listings, CommittedMemory, Protocol):
    """Hosts: registration, heartbeats, drain, removal."""

    @abstractmethod
    async def register_host(self, host_id: str, *, address: str = "", role: str = "worker") -> HostRecord:
        """Create a host row before its first heartbeat (no capacity, ``heartbeat_at`` 0, so it is
        stale and never placed on), or update the address of a known one."""

    @abstractmethod
    async def listing_changes(self, since: float) -> list[ListingChange]:
        """Entries of hosts' listings that changed (appeared, went, or were re-read whole) at or
        after ``since`` by the store's clock: what the reconciler checks against the records."""

    @abstractmethod
    async def drain(self, host_id: str) -> HostRecord:
        """Stop new reservations on the host (``state=draining``); raises :class:`RecordNotFound`."""

    @abstractmethod
    async def undrain(self, host_id: str) -> HostRecord: ...

    @abstractmethod
    async def delete_host(self, host_id: str) -> bool:
        """Forget a host and end its reservations. Its sandbox records stay (a host's death never
        deletes a placement). True if it existed."""

    @abstractmethod
    async def get_host(self, host_id: str) -> HostRecord | None: ...


class Reservations(Protocol):
    """Capacity claims: taken against a host's admittable, ended once, expired by their TTL."""

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
        """Reserve ``memory_mb`` (a charge) and ``cpu`` on a ready host if they fit beside its live
        reservations (``corral.core.admission.host_fits``). None: no room (or no such host, or
        draining). Race-proof across processes and replicas; expired reservations never count against the room."""
        check_reservation(memory_mb, cpu, ttl_s)
        return await self._reserve_checked(ReserveItem(host_id, memory_mb, cpu, sandbox_id), owner, ttl_s)

    async def reserve_best(
        self,
        candidates: Sequence[str],
        *,
        memory_mb: int,
        cpu: float = 0.0,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None = None,
        image: str | None = None,
    ) -> ReservationRecord | None:
        """Among ``candidates`` (the K sampled hosts), reserve on the one that fits with the best
        spread score (``corral.core.scoring.Scorer``) by the store's *current* live reserved totals,
        so replicas see each other's in-flight work at commit; ties go by ``corral.core.fit.tie_rank``
        salted with ``sandbox_id`` (else the reservation's id). ``image``: the create's image (a
        digest); a candidate that holds it scores higher (``ScoreWeights.image``). The record's
        ``host_id`` says which host it took. None: none of them has room."""
        check_reservation(memory_mb, cpu, ttl_s)
        if not candidates:
            return None
        return await self._reserve_best_checked(
            candidates, ReserveItem("", memory_mb, cpu, sandbox_id), owner, ttl_s, image
        )

    # Every backend's claims are checked above, once; what a backend writes is below.

    @abstractmethod
    async def _reserve_checked(self, item: ReserveItem, owner: str, ttl_s: float) -> ReservationRecord | None:
        """:meth:`reserve` of a checked claim."""

    @abstractmethod
    async def _reserve_best_checked(
        self, candidates: Sequence[str], item: ReserveItem, owner: str, ttl_s: float, image: str | None
    ) -> ReservationRecord | None:
        """:meth:`reserve_best` of a checked claim (its host empty) among candidates, at least one."""

    @abstractmethod
    async def reserve_batch(
        self, items: Sequence[ReserveItem], *, owner: str, ttl_s: float
    ) -> list[ReservationRecord] | None:
        """All or nothing, in one transaction: every item reserved (in order), or none and None.
        Several items may name the same host; their sum must fit."""

    @abstractmethod
    async def cancel(self, reservation_id: str) -> bool:
        """End a reservation because its placement failed. Never touches a sandbox record (a late
        rollback after a successful place is harmless). True if this call ended it."""

    @abstractmethod
    async def sweep_expired(self) -> int:
        """End every reservation past its ``expires_at``. Returns how many ended."""

    @abstractmethod
    async def next_expiry(self) -> float | None:
        """When the earliest live reservation expires (for an honest Retry-After); None if none."""


class ReservationStore(Reservations, Protocol):
    """Reservations: capacity promised on a host, taken and ended atomically."""

    @abstractmethod
    async def confirm(self, reservation_id: str) -> bool:
        """End a reservation because its sandbox is placed and accounted for. True if this call
        ended it (each reservation ends exactly once)."""

    @abstractmethod
    async def get_reservation(self, reservation_id: str) -> ReservationRecord | None:
        """The reservation if it has not ended (an expired, unswept one is returned; check
        ``expires_at``)."""

    @abstractmethod
    async def drop_owner(self, owner: str) -> int:
        """End every reservation held by ``owner`` (a replica that died). Returns how many ended."""

    @abstractmethod
    async def outstanding(self) -> dict[str, Pending]:
        """Live reserved memory and cpu per host, for every host that has any (idle fleet: {})."""

    @abstractmethod
    async def audit(self) -> list[str]:
        """Check the books: per host, the stored reserved totals equal the sum of its reservation
        rows and are not negative. Returns one line per discrepancy; [] when consistent."""


class Leases(Protocol):
    """Replica liveness (a reservation ends with its owner's lease) and the single leader."""

    @abstractmethod
    async def renew_replica(self, replica_id: str, ttl_s: float) -> float:
        """Keep a replica alive; returns its lease's new expiry. A reservation's ``owner`` is the
        replica id: when the lease lapses, ``expire_replicas`` ends its reservations."""

    @abstractmethod
    async def expire_replicas(self) -> list[str]:
        """End every reservation of each replica whose lease lapsed, forget those leases, and return
        their ids."""

    @abstractmethod
    async def live_replicas(self) -> int:
        """How many replicas hold a lease that has not lapsed (each enforces its share of a sum)."""

    @abstractmethod
    async def abandoned(self, sandbox_ids: Collection[str]) -> set[str]:
        """Of ``sandbox_ids``, the records still ``reserved`` whose ``owner`` holds no live lease (it
        lapsed, or was ended or released): the create that was placing each died with its replica.
        A record with no owner is never among them (only the create deadline resolves it)."""

    @abstractmethod
    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool:
        """Take or renew the single-leader lease ``name`` (e.g. "reconciler"). Re-entrant for its
        holder; anyone may take it over once it has expired."""


class LeaseStore(Leases, Protocol):
    """Leases: replicas' liveness and the leader lease."""

    @abstractmethod
    async def release_replica(self, replica_id: str) -> int:
        """A clean shutdown: drop the lease and end the replica's reservations (how many)."""

    @abstractmethod
    async def resign(self, name: str, holder: str) -> bool:
        """Give the lease up if ``holder`` has it. True if it did."""


class RecordCreate(Protocol):
    """A sandbox record written, with its idempotency key, name and quota checked."""

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
        (:class:`QuotaExceeded`; :class:`RecordNotFound` for an unknown tenant), then the insert.
        ``created_at``/``updated_at``/``version`` are set by the store."""
        check_sandbox(record)
        return await self._create_checked(record, idempotency_key, request_hash)

    # Every backend's records are checked in this contract, once; what a backend writes is below.

    @abstractmethod
    async def _create_checked(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome:
        """:meth:`create_sandbox` of a checked record."""


class ClaimRecords(RecordCreate, Protocol):
    """What a warm claim writes through: the create's checks first, as a read (a warm sandbox once
    handed over cannot be given back), then the record."""

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
        check_sandbox(record)
        return await self._check_create_checked(record, idempotency_key, request_hash)

    @abstractmethod
    async def _check_create_checked(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome | None:
        """:meth:`check_create` of a checked record."""


class RecordReads(Protocol):
    """Sandbox records read: one, some, or a page."""

    @abstractmethod
    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        """The sandbox, or None. With ``tenant_id``, another tenant's sandbox is None too."""

    @abstractmethod
    async def get_sandboxes(self, sandbox_ids: Collection[str]) -> dict[str, SandboxRecord]:
        """Those of ``sandbox_ids`` that have a record, by id (any tenant)."""

    async def list_sandboxes(
        self,
        *,
        tenant_id: str | None = None,
        host_id: str | None = None,
        state: SandboxState | Collection[SandboxState] | None = None,
        limit: int = 100,
        cursor: str | None = None,
        newest_first: bool = False,
    ) -> Page:
        """Filtered, ordered by (created_at, id), or its reverse when ``newest_first``; keyset
        pagination with an opaque, stable cursor (a page's cursor continues in the order that made
        it). ``limit`` is 1..1000. A bad cursor raises :class:`InvalidRecord`."""
        states = check_page(limit, state)
        after = None if cursor is None else rows.decode_cursor(cursor)
        return await self._list_checked(PageQuery(tenant_id, host_id, states, limit, after, newest_first))

    async def list_sandbox_summaries(
        self,
        *,
        tenant_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int = 1000,
    ) -> list[SandboxSummary]:
        """The live (not deleted) sandboxes' summaries, of one tenant or all, in the order
        ``list_sandboxes`` pages in, those after the position ``after`` (a summary's
        :attr:`~SandboxSummary.position`): keyset paging whose position the caller keeps, so a
        sandbox created or deleted between two reads neither repeats nor moves another. One query.
        ``limit`` is 1..10,000."""
        check_page(limit, None, MAX_SUMMARIES)
        return await self._summaries_checked(tenant_id, after, limit)

    @abstractmethod
    async def _list_checked(self, query: PageQuery) -> Page:
        """:meth:`list_sandboxes` of a checked query."""

    @abstractmethod
    async def _summaries_checked(
        self, tenant_id: str | None, after: tuple[float, str] | None, limit: int
    ) -> list[SandboxSummary]:
        """:meth:`list_sandbox_summaries` of a checked size."""


class RecordStates(Protocol):
    """Sandbox records moved between states (compare-and-set) and deleted."""

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
        lost race, :class:`RecordNotFound`."""
        new_state, expected = check_state_change(state, expect)
        change = StateChange(new_state, expected, expect_version, host_id, reservation_id, placement)
        return await self._set_state_checked(sandbox_id, change)

    @abstractmethod
    async def _set_state_checked(self, sandbox_id: str, change: StateChange) -> SandboxRecord:
        """:meth:`set_sandbox_state` of a checked change."""

    @abstractmethod
    async def set_sandbox_network(self, sandbox_id: str, network: str | None) -> SandboxRecord:
        """Replace the sandbox's egress policy (``network_text`` of one; None: mode "none")."""

    @abstractmethod
    async def set_sandbox_paused(
        self, sandbox_id: str, paused: str | None, expires_at: float | None
    ) -> SandboxRecord:
        """Mark the sandbox paused (``paused`` its kind, corral.core.lifecycle) or not (None), and
        set its expiry with it in the same write (a paused sandbox waits: None)."""

    @abstractmethod
    async def delete_sandbox(
        self, sandbox_id: str, *, forget_idempotency: bool = False, expect: SandboxState | None = None
    ) -> bool:
        """Remove the record (its name becomes free). True if it existed. ``forget_idempotency``: a
        create that was refused leaves no trace, so its key, retried, creates anew. ``expect``: only if
        it is in that state (a record placed meanwhile stays, and so does its key); False otherwise."""


class Placements(Protocol):
    """The explanation stored with a sandbox's placement."""

    @abstractmethod
    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None:
        """The placement explanation (JSON text) kept with the sandbox, or None when none was kept.
        Raises :class:`RecordNotFound` when the sandbox does not exist (or is another tenant's)."""

    @abstractmethod
    async def get_placements(self, sandbox_ids: Collection[str]) -> dict[str, str | None]:
        """The explanations of those of ``sandbox_ids`` that have a record, by id (any tenant), in
        one read: what a listing of many sandboxes' events reads."""


class RecordSweeps(Protocol):
    """What the leader sweeps from records: sandboxes past their TTL, old idempotency keys."""

    @abstractmethod
    async def expired_sandboxes(self, now: float | None = None, *, limit: int = 100) -> list[SandboxRecord]:
        """Live sandboxes whose ``expires_at`` has passed (``now`` defaults to the store's clock),
        earliest first, for the TTL reaper."""

    @abstractmethod
    async def purge_idempotency_keys(self, older_than: float) -> int:
        """Forget idempotency keys first used before ``older_than`` (epoch seconds); a retry after
        that creates anew. Returns how many were forgotten."""


class SandboxStore(ClaimRecords, RecordReads, RecordStates, Placements, RecordSweeps, Protocol):
    """Sandbox records: create, state changes, expiry, listing, deletion."""

    @abstractmethod
    async def host_activity(self, since: float) -> dict[str, tuple[int, int]]:
        """Per host: (sandboxes placed there created at or after ``since``, configured MiB of its live
        sandboxes). What an operator's view shows beside each host's heartbeat."""

    @abstractmethod
    async def set_sandbox_expiry(self, sandbox_id: str, expires_at: float | None) -> SandboxRecord:
        """Set (or clear) the sandbox's own TTL deadline."""


class Rehoming(Protocol):
    """A dead host's sandboxes orphaned or moved: what only the leader writes."""

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


class Parking(Protocol):
    """A create parked for capacity."""

    @abstractmethod
    async def park_sandbox(self, sandbox_id: str, wait_until: float) -> SandboxRecord:
        """A ``reserved`` record no host took becomes ``waiting_capacity`` until ``wait_until``
        (:class:`StateConflict` if it is no longer ``reserved``)."""


class SealedSpecReader(Protocol):
    """What a sandbox is started again from."""

    @abstractmethod
    async def sealed_spec(self, sandbox_id: str) -> str | None:
        """The sandbox's sealed spec (None: it has none)."""


class SealedSpecs(Protocol):
    """Every sealed spec, page by page, and its compare-and-set (re-sealing under a new key)."""

    @abstractmethod
    async def sealed_specs(self, after_id: str, limit: int) -> list[tuple[str, str]]:
        """(id, sealed spec) of sandboxes with one, by id after ``after_id``."""

    @abstractmethod
    async def replace_sealed_spec(self, sandbox_id: str, old: str, new: str) -> bool:
        """Compare-and-set of a sealed spec (re-sealing under a new key)."""


class FailoverStore(Rehoming, Parking, SealedSpecReader, SealedSpecs, Protocol):
    """Failover: a dead host's sandboxes orphaned or moved, parked creates, sealed specs."""


class TenantUsage(Protocol):
    """A tenant's live usage, from its counters."""

    @abstractmethod
    async def usage(self, tenant_id: str) -> Usage: ...


class TenantDirectory(Protocol):
    """Every tenant's record: what each replica reads its tenants' create rates from."""

    @abstractmethod
    async def list_tenants(self) -> list[TenantRecord]: ...


class TenantRemoval(Protocol):
    """A tenant removed, with what it owns, in one transaction."""

    @abstractmethod
    async def delete_tenant(self, tenant_id: str) -> bool:
        """Delete the tenant and revoke every token of it; its ended records (``stopped``, ``failed``),
        Idempotency-Keys and custom domains go with it, all in one transaction. Raises
        :class:`TenantHasSandboxes` while any of its sandboxes is live (``LIVE_STATES``, parked creates
        included): no create of its can commit between that check and the delete. Its tombstones
        (``deleted``) stay for the reconciler to stop on their hosts. True if it existed."""


class AccessStore(TenantUsage, TenantDirectory, TenantRemoval, Protocol):
    """Tenants and quotas, API tokens, host enrolment and fleet secrets."""

    @abstractmethod
    async def create_tenant(
        self, name: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float = DEFAULT_MAX_CPUS
    ) -> TenantRecord:
        """Raises :class:`NameConflict` if the name is taken."""

    @abstractmethod
    async def get_tenant(self, tenant_id: str) -> TenantRecord | None: ...

    @abstractmethod
    async def get_tenant_by_name(self, name: str) -> TenantRecord | None: ...

    @abstractmethod
    async def set_quota(
        self, tenant_id: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float | None = None
    ) -> TenantRecord:
        """``max_cpus`` None: unchanged. Lowering a limit below what is live refuses new creates only."""

    @abstractmethod
    async def set_create_rate(
        self, tenant_id: str, *, rate_per_s: float | None, burst: int | None
    ) -> TenantRecord:
        """Both as given; None: the control plane's default. Raises :class:`RecordNotFound`."""

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

    @abstractmethod
    async def enrol_host(self, host_id: str) -> HostCredentials:
        """Create the host's record if new, and give it fresh credentials: its previous agent
        tokens and key are revoked, and its ``seq`` starts over (in one transaction)."""

    @abstractmethod
    async def host_key(self, host_id: str) -> str | None:
        """The key the control plane presents to ``host_id``'s agent; None if not enrolled."""

    @abstractmethod
    async def forget_host(self, host_id: str) -> bool:
        """Delete the host, its reservations and its credentials. Raises :class:`HostHasSandboxes` while a
        live sandbox is on it. True if there was anything to forget."""


class TemplateReader(Protocol):
    """A template by name."""

    @abstractmethod
    async def get_template(self, name: str) -> TemplateRecord | None: ...


class PoolReader(Protocol):
    """The pools' intent and the templates they are of, as a replica reads them."""

    @abstractmethod
    async def list_pools(self) -> list[PoolRecord]:
        """Every pool with its per-host targets, ordered by template."""

    @abstractmethod
    async def list_templates(self) -> list[TemplateRecord]: ...


class PoolStore(PoolReader, Protocol):
    """The admin's pools and the leader's per-host targets for them."""

    async def create_pool(self, template: str, *, size: int, max_per_host: int | None = None) -> PoolRecord:
        """Raises :class:`NameConflict` if the template already has a pool, :class:`RecordNotFound` if the
        template does not exist."""
        check_pool(size, max_per_host)
        return await self._create_pool_checked(template, size, max_per_host)

    async def update_pool(
        self, template: str, *, size: int | None = None, max_per_host: int | _Unset | None = UNSET
    ) -> PoolRecord:
        """Change a pool's size or per-host cap; raises :class:`RecordNotFound`."""
        check_pool(size, max_per_host)
        return await self._update_pool_checked(template, size, max_per_host)

    @abstractmethod
    async def _create_pool_checked(self, template: str, size: int, max_per_host: int | None) -> PoolRecord:
        """:meth:`create_pool` of a checked size and cap."""

    @abstractmethod
    async def _update_pool_checked(
        self, template: str, size: int | None, max_per_host: int | _Unset | None
    ) -> PoolRecord:
        """:meth:`update_pool` of a checked size and cap."""

    @abstractmethod
    async def delete_pool(self, template: str) -> bool:
        """Forget the pool and its targets. True if it existed."""

    @abstractmethod
    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool:
        """Replace the pool's per-host targets (hosts with 0 are dropped). False if the pool is gone."""


class TemplateStore(TemplateReader, PoolStore, Protocol):
    """Templates and their warm pools."""

    async def create_template(self, template: TemplateRecord) -> TemplateRecord:
        """Raises :class:`NameConflict` if it exists. The built-in ``default`` (1 cpu, 512 MiB, not
        stateful) exists on every migrated store."""
        check_template(template)
        return await self._create_template_checked(template)

    @abstractmethod
    async def _create_template_checked(self, template: TemplateRecord) -> TemplateRecord:
        """:meth:`create_template` of a checked template."""

    @abstractmethod
    async def delete_template(self, name: str) -> bool: ...

    async def publish_template(self, template: TemplateRecord) -> TemplateRecord:
        """The template at ``template.version``, in one write: version 1 is created (as
        :meth:`create_template`); a later version replaces the record only while the store holds the
        version before it, else :class:`NameConflict` (another build published first, or the
        template was deleted)."""
        check_template(template)
        if template.version == 1:
            return await self._create_template_checked(template)
        return await self._publish_template_checked(template)

    @abstractmethod
    async def _publish_template_checked(self, template: TemplateRecord) -> TemplateRecord:
        """:meth:`publish_template` of a checked template past its first version."""

    @abstractmethod
    async def images_in_use(self) -> set[str]:
        """The images a template or a sandbox record (any state) names: what image collection keeps."""


class NamedRecords(Protocol):
    """A sandbox by its name, as a surface that names records (Kubernetes) reads it."""

    @abstractmethod
    async def get_sandbox_by_name(self, tenant_id: str, name: str) -> SandboxRecord | None:
        """The tenant's sandbox of that name that is not ``deleted`` (names are unique among
        those), or None: one index read."""


class Domains(Protocol):
    """Custom domains bound to sandboxes' ports, unique across the fleet by the store's own key: of
    two binds of one name, one commits and the other is refused."""

    @abstractmethod
    async def bind_domain(self, hostname: str, sandbox_id: str, port: int) -> DomainRecord:
        """Bind ``hostname`` (canonical) to ``sandbox_id``'s ``port`` (the same again: its port
        changes). :class:`DomainTaken` when another sandbox that is not gone (stopped, failed,
        deleted) holds it; a gone holder's binding is taken over. :class:`RecordNotFound` when
        ``sandbox_id`` is not a live sandbox."""

    @abstractmethod
    async def get_domain(self, hostname: str) -> DomainRecord | None: ...

    @abstractmethod
    async def list_domains(self, sandbox_id: str) -> list[DomainRecord]:
        """The sandbox's domains, by name."""

    @abstractmethod
    async def unbind_domain(self, hostname: str, sandbox_id: str) -> bool:
        """Remove ``hostname`` if ``sandbox_id`` holds it; whether it did. (Removing a sandbox's
        record removes its domains in the same transaction.)"""


class ChangeFeed(Protocol):
    """Every write to a sandbox, template or pool record, each at one store-wide version (in commit
    order), kept as a bounded history: what a watch reads, on any replica."""

    @abstractmethod
    async def changes_since(self, version: int, *, limit: int = 1000) -> list[ChangeRecord]:
        """Changes after ``version``, oldest first, at most ``limit``."""

    @abstractmethod
    async def change_bounds(self) -> tuple[int, int]:
        """(the oldest version the history still holds minus one, the latest version): a watch may
        resume from any version in that range; 0 and 0 for a store with no change yet."""

    @abstractmethod
    async def prune_changes(self, keep: int) -> int:
        """Forget all but the newest ``keep`` changes. Returns how many were forgotten."""

    @abstractmethod
    def on_change(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call ``wake`` (on the event loop, without awaiting) soon after a change may have
        committed, on any replica; returns the function that stops it. Never a poll of the tables:
        PostgreSQL's LISTEN, or SQLite's own commits."""


class Store(
    HostStore,
    ReservationStore,
    LeaseStore,
    SandboxStore,
    FailoverStore,
    AccessStore,
    TemplateStore,
    NamedRecords,
    Domains,
    ChangeFeed,
):
    """The state of record. Every method is one transaction (or one statement) of the backend; every
    "cannot reach the database" failure surfaces as :class:`StoreUnavailable`."""

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
