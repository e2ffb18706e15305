"""The store's records: what it holds and returns, frozen; and the enums they use."""

from __future__ import annotations

import enum
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from corral.core.lifecycle import Lifecycle, LifecycleError, check_paused
from corral.core.netpolicy import EgressPolicy, PolicyError, parse_policy
from corral.core.types import (
    DEFAULT_SANDBOX_PIDS,
    MAX_SANDBOX_DISK_MB,
    MAX_SANDBOX_PIDS,
    MIN_SANDBOX_DISK_MB,
    MIN_SANDBOX_PIDS,
    CreateRequest,
    HostFacts,
    HostView,
    Pending,
)
from corral.images.config import ImageConfig
from corral.images.digest import check_digest
from corral.store.errors import InvalidRecord, QuotaExceeded


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

# A removed tenant's records that go with it: ended for good. Its tombstones (``deleted``) do not: the
# reconciler still has to stop each on its host before it deletes the record.
REMOVED_WITH_TENANT: frozenset[SandboxState] = frozenset({SandboxState.STOPPED, SandboxState.FAILED})


class Role(enum.StrEnum):
    ADMIN = "admin"
    TENANT = "tenant"
    AGENT = "agent"
    METRICS = "metrics"  # reads /metrics, nothing else: what a Prometheus scraper holds


class _Unset(enum.Enum):
    UNSET = enum.auto()


# "Leave this field as it is" (None is a value: it clears the field).
UNSET = _Unset.UNSET


# -- records ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Listing:
    """The sandboxes a heartbeat says its host runs for records (warm ones are no record's), each with
    the epoch of its copy: either the whole set, or what changed since the heartbeat whose set the
    store holds (``base``), so a heartbeat costs what changed, not what runs."""

    # None: ``entries`` is the whole set. Otherwise the seq of the heartbeat this one builds on: its
    # changes apply only if that is the set the store holds.
    base: int | None = None
    # Sandbox id -> epoch: the whole set, or the entries added (or whose epoch changed) since ``base``.
    entries: Mapping[str, int] = field(default_factory=dict)
    # Entries gone since ``base``. A change may name a sandbox the store never had: one that started
    # and ended between two heartbeats, whose record may still say it runs.
    removed: frozenset[str] = frozenset()
    # :func:`corral.core.listing.digest_of` the whole set after this heartbeat; None: not checked (an
    # agent older than digests, which sends whole sets only).
    digest: int | None = None


@dataclass(frozen=True, slots=True)
class HostReport:
    """What an agent reports. ``seq`` must increase strictly across the agent's whole life, restarts
    included (seed it from wall-clock milliseconds at start): a report whose seq is not newer than
    the stored one is a delayed packet and is ignored."""

    host_id: str
    seq: int
    facts: HostFacts
    listing: Listing = Listing()
    # The agent's base URL; empty for in-process agents.
    address: str = ""
    # Warm sandboxes per template: (ready, starting). They are not in the listing: no record
    # claims them and none ever will until one is claimed.
    warm: Mapping[str, tuple[int, int]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRecord(HostView):
    """A host as the store holds it: its last accepted heartbeat plus what only the store knows
    (drain state, outstanding live reservations, how much of its listing it holds)."""

    seq: int
    registered_at: float
    address: str
    # Live (unexpired) reservations on this host: capacity promised that no heartbeat shows yet.
    reserved_mb: int
    reserved_cpu: float
    # Warm sandboxes per template as the last heartbeat said: (ready, starting).
    warm: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # How many sandboxes its listing holds.
    sandbox_count: int = 0
    # The seq of the heartbeat whose listing the store holds, and when that listing was last brought
    # up to date; None: the store holds none it can trust (the host must send its whole set).
    listed_seq: int | None = None
    listed_at: float = 0.0

    def warm_ready(self, template: str) -> int:
        return self.warm.get(template, (0, 0))[0]

    @property
    def heard_from(self) -> bool:
        """Whether it has ever heartbeated (an enrolled host has a row before it does)."""
        return self.heartbeat_at > 0

    def view(self) -> HostView:
        return self

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

    @property
    def listed_seq(self) -> int | None:
        """The seq of the heartbeat whose listing the store now holds for this host: the agent's
        acknowledgement. A heartbeat whose seq this is not must be followed by the whole set."""
        return self.host.listed_seq


@dataclass(frozen=True, slots=True)
class ListingChange:
    """One entry of a host's listing as it changed: present or gone since ``changed_at``."""

    host_id: str
    sandbox_id: str
    present: bool
    changed_at: float


def disputed(change: ListingChange, record: SandboxRecord | None) -> bool:
    """Whether a sandbox's record disputes its host's listing entry. Listed here while no record claims
    it here: none at all, or one placed on another host (a start whose reply was lost, tried again
    elsewhere); a record still being placed claims no host yet. Or gone from here while its record
    says it runs here. The stores find disputed entries with the same rule written as a query."""
    if change.present:
        return record is None or (
            record.host_id is not None
            and record.host_id != change.host_id
            and record.state is not SandboxState.RESERVED
        )
    return record is not None and record.state is SandboxState.RUNNING and record.host_id == change.host_id


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
    # The replica (a lease holder) whose create wrote it: while it is ``reserved``, that create is in
    # flight there, and once that replica's lease lapses nothing will place it (the leader resolves it).
    owner: str | None = None
    # Its image (a digest, its template's when it was created) and its own disk's size in MiB.
    image: str | None = None
    disk_mb: int | None = None
    # Its egress policy (corral.core.netpolicy's wire form, canonical JSON); None: mode "none", no
    # interface but loopback. Enforced on its host, changed in place while it runs.
    network: str | None = None
    # What its timeout does (corral.core.lifecycle's text; None: it is killed), and how it is paused
    # now, when it is (``memory`` or ``filesystem``; None: not paused by the control plane).
    lifecycle: str | None = None
    paused: str | None = None

    @property
    def leased(self) -> bool:
        """Whether its host may run it only under a run lease: a recreate-policy sandbox starts
        elsewhere once its host is dead, so the host must have stopped running it by then."""
        return self.failover == FAILOVER_RECREATE

    def request(self) -> CreateRequest:
        """What the sandbox asks of a host, as placement weighs it. Its template is not asked of the
        host's filter yet: a host without it refuses the start, and the create is tried elsewhere.
        Its image is no filter either: a host that lacks it fetches it, and scores lower."""
        return CreateRequest(
            memory_mb=self.memory_mb, cpu=self.cpus, stateful=self.stateful, image=self.image
        )


@dataclass(frozen=True, slots=True)
class CreateOutcome:
    record: SandboxRecord
    # True: the idempotency key had been seen; this is the first call's sandbox, nothing was created.
    replayed: bool


@dataclass(frozen=True, slots=True)
class DomainRecord:
    """A custom domain bound to a sandbox's port: ``hostname`` (canonical, unique fleet-wide) routes
    like ``{port}-{sandbox_id}.{domain}``; removed with the sandbox."""

    hostname: str
    sandbox_id: str
    tenant_id: str
    port: int
    created_at: float


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """One entry of the store's change feed: a write to a record of ``kind`` (``sandbox``,
    ``template`` or ``pool``) named ``key`` (a sandbox's id, a template's name, a pool's template), at
    ``version``, one store-wide counter that grows with every change in commit order."""

    version: int
    kind: str
    key: str
    tenant_id: str | None
    name: str | None
    deleted: bool


class Page(NamedTuple):
    items: list[SandboxRecord]
    # Opaque; pass it back as ``cursor`` for the next page. None: this was the last page.
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class StateChange:
    """A checked compare-and-set of a sandbox's state (``Store.set_sandbox_state``): the target,
    the states and version it must be found at (None: any), and what it sets beside (``UNSET``:
    left as is)."""

    state: SandboxState
    expected: frozenset[SandboxState] | None
    expect_version: int | None
    host_id: str | _Unset | None
    reservation_id: str | _Unset | None
    placement: str | _Unset | None


@dataclass(frozen=True, slots=True)
class PageQuery:
    """A checked page of sandbox records (``Store.list_sandboxes``): its filters (None: any), its
    size, and the position its cursor holds (None: from the start)."""

    tenant_id: str | None
    host_id: str | None
    states: frozenset[SandboxState] | None
    limit: int
    after: tuple[float, str] | None
    newest_first: bool


class SandboxSummary(NamedTuple):
    """What a listing of many shows of a sandbox (``kubectl get``'s rows): its record's identity,
    state and labels, read without the rest of it. Named as :class:`SandboxRecord`'s fields are."""

    id: str
    tenant_id: str
    name: str | None
    template: str
    host_id: str | None
    state: SandboxState
    metadata: Mapping[str, str]
    created_at: float
    warm: bool

    @property
    def position(self) -> tuple[float, str]:
        """Where it stands in the listing's order: what ``after`` takes to list those after it."""
        return (self.created_at, self.id)


# A tenant's CPU quota when none is given: generous (a thousand one-CPU sandboxes, as many as a
# tenant's default count), yet a bound: CPU is overcommitted on every host, so without one a single
# tenant could take a fleet's whole CPU. Tenants that predate the CPU quota got it too (migration 14).
DEFAULT_MAX_CPUS = 1024.0


def to_millicores(cpu: float) -> int:
    """CPU as the store keeps it: integer millicores, so running totals add and subtract exactly."""
    return round(cpu * 1000)


def from_millicores(m: int) -> float:
    return m / 1000


@dataclass(frozen=True, slots=True)
class TenantRecord:
    id: str
    name: str
    max_sandboxes: int
    max_memory_mb: int
    created_at: float
    # CPUs its live sandboxes may ask for in all (whole millicores, as stored).
    max_cpus: float = DEFAULT_MAX_CPUS
    # Creates a second, and at most at once, summed over every replica; None: the control plane's default.
    create_rate_per_s: float | None = None
    create_burst: int | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    """What a tenant's live sandboxes (``LIVE_STATES``) hold against its quota."""

    sandboxes: int
    memory_mb: int
    cpus: float


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
    # The image its sandboxes' roots are made of (a digest) and how they run in it; None: the host's
    # own system directories, read-only. A rebuild writes a new digest: sandboxes keep the one they
    # started on (their record's ``image``).
    image: str | None = None
    image_config: ImageConfig | None = None
    disk_mb: int | None = None  # its sandboxes' own disk; None: the default (a create may override)
    version: int = 1  # each build of it is the next version (its image a new digest)


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


def as_states(value: SandboxState | Collection[SandboxState] | None) -> frozenset[SandboxState] | None:
    """Normalise an ``expect``/``state`` filter argument."""
    if value is None:
        return None
    if isinstance(value, str):
        return frozenset({SandboxState(value)})
    return frozenset(SandboxState(v) for v in value)


# The most rows one page of a listing holds.
MAX_PAGE = 1000
# The most summaries one read holds: a namespace's whole Table in one query.
MAX_SUMMARIES = 10_000


def check_page(
    limit: int, state: SandboxState | Collection[SandboxState] | None, most: int = MAX_PAGE
) -> frozenset[SandboxState] | None:
    """A listing's page size and state filter as every store takes them (the states, normalised)."""
    if not 1 <= limit <= most:
        raise InvalidRecord(f"limit: must be 1..{most}")
    try:
        return as_states(state)
    except ValueError as exc:
        raise InvalidRecord(f"state: {exc}") from exc


def check_ttl(ttl_s: float) -> None:
    """A lease's or a claim's time to live as every store takes it: positive (NaN is refused)."""
    if not ttl_s > 0:
        raise InvalidRecord("ttl_s: must be positive")


def check_state_change(
    state: SandboxState, expect: SandboxState | Collection[SandboxState] | None
) -> tuple[SandboxState, frozenset[SandboxState] | None]:
    """A state change's target and expected states, as the stores take them (a bad one is refused)."""
    try:
        return SandboxState(state), as_states(expect)
    except ValueError as exc:
        raise InvalidRecord(f"state: {exc}") from exc


def check_quota(tenant: TenantRecord, used: Usage, memory_mb: int, cpus: float) -> None:
    """One more live sandbox of ``memory_mb`` and ``cpus`` within a tenant's limits, on what it uses
    now. CPU is compared in millicores, as the stores count it."""
    if used.sandboxes + 1 > tenant.max_sandboxes:
        raise QuotaExceeded("max_sandboxes", tenant.max_sandboxes, used.sandboxes, 1)
    if used.memory_mb + memory_mb > tenant.max_memory_mb:
        raise QuotaExceeded("max_memory_mb", tenant.max_memory_mb, used.memory_mb, memory_mb)
    if to_millicores(used.cpus) + to_millicores(cpus) > to_millicores(tenant.max_cpus):
        raise QuotaExceeded("max_cpus", tenant.max_cpus, used.cpus, cpus)


def claim_record(id: str, item: ReserveItem, owner: str, ttl_s: float, now: float) -> ReservationRecord:
    """The record of ``item`` claimed at ``now`` for ``ttl_s``: its CPU as every store keeps it (whole
    millicores)."""
    return ReservationRecord(
        id=id,
        host_id=item.host_id,
        memory_mb=item.memory_mb,
        cpu=from_millicores(to_millicores(item.cpu)),
        owner=owner,
        sandbox_id=item.sandbox_id,
        created_at=now,
        expires_at=now + ttl_s,
    )


def check_reservation(memory_mb: int, cpu: float, ttl_s: float) -> None:
    """A claim as every store takes it: some memory (the core's fit rule reads a request, and a
    sandbox asks for memory; a claim of none is no sandbox's), no negative CPU, a positive TTL."""
    if memory_mb <= 0:
        raise InvalidRecord("memory_mb: a reservation must claim at least 1 MiB")
    if cpu < 0:
        raise InvalidRecord("cpu: a reservation cannot be negative")
    check_ttl(ttl_s)


def check_sandbox(r: SandboxRecord) -> None:
    """A sandbox record as every store takes it."""
    if not r.id:
        raise InvalidRecord("id: must not be empty")
    if not r.tenant_id:
        raise InvalidRecord("tenant_id: must not be empty")
    if r.memory_mb <= 0:
        raise InvalidRecord("memory_mb: must be positive")
    if r.cpus < 0:
        raise InvalidRecord("cpus: must not be negative")
    if r.name is not None and not r.name:
        raise InvalidRecord("name: must not be empty (use None for no name)")
    if r.failover not in FAILOVER_POLICIES:
        raise InvalidRecord(f"failover: one of {', '.join(FAILOVER_POLICIES)}")
    _check_image(r.image, r.disk_mb)
    check_network(r.network)
    check_lifecycle(r.lifecycle, r.paused)
    try:
        SandboxState(r.state)
    except ValueError as exc:
        raise InvalidRecord(f"state: {exc}") from exc


def check_template(template: TemplateRecord) -> None:
    """A template as every store takes it."""
    if not template.name:
        raise InvalidRecord("name: must not be empty")
    if template.memory_mb <= 0 or template.cpus <= 0:
        raise InvalidRecord("memory_mb/cpus: must be positive")
    if not MIN_SANDBOX_PIDS <= template.pids <= MAX_SANDBOX_PIDS:
        raise InvalidRecord(f"pids: must be between {MIN_SANDBOX_PIDS} and {MAX_SANDBOX_PIDS}")
    _check_image(template.image, template.disk_mb)
    if template.version < 1:
        raise InvalidRecord("version: at least 1")
    if template.failover not in FAILOVER_POLICIES:
        raise InvalidRecord(f"failover: one of {', '.join(FAILOVER_POLICIES)}")
    if template.image_config is not None and template.image is None:
        raise InvalidRecord("image_config: only with an image")


def check_network(network: str | None) -> None:
    """A record's egress policy: None, or the canonical JSON of one the core can enforce."""
    if network is None:
        return
    try:
        data = json.loads(network)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        policy = parse_policy(data)
    except (ValueError, PolicyError) as exc:
        raise InvalidRecord(f"network: {exc}") from None
    if network != network_text(policy):
        raise InvalidRecord("network: not in canonical form (use network_text)")


def check_lifecycle(lifecycle: str | None, paused: str | None) -> None:
    """A record's lifecycle (None, or a canonical one) and pause (None or a kind)."""
    try:
        Lifecycle.parse(lifecycle)
        check_paused(paused)
    except LifecycleError as exc:
        raise InvalidRecord(f"lifecycle: {exc}") from None


def network_text(policy: EgressPolicy) -> str | None:
    """The record's form of a policy: None for mode "none", else its canonical JSON."""
    return json.dumps(policy.to_dict(), sort_keys=True, separators=(",", ":")) if policy.attached else None


def _check_image(image: str | None, disk_mb: int | None) -> None:
    if image is not None:
        try:
            check_digest(image)
        except ValueError as exc:
            raise InvalidRecord(f"image: {exc}") from None
    if disk_mb is not None and not MIN_SANDBOX_DISK_MB <= disk_mb <= MAX_SANDBOX_DISK_MB:
        raise InvalidRecord(f"disk_mb: must be between {MIN_SANDBOX_DISK_MB} and {MAX_SANDBOX_DISK_MB}")


def check_tenant(name: str, max_sandboxes: int, max_memory_mb: int, max_cpus: float) -> None:
    """A new tenant as every store takes it: a name, and limits ``check_tenant_quota`` takes."""
    if not name:
        raise InvalidRecord("name: must not be empty")
    check_tenant_quota(max_sandboxes, max_memory_mb, max_cpus)


def check_tenant_quota(max_sandboxes: int, max_memory_mb: int, max_cpus: float) -> None:
    """A tenant's limits as every store takes them."""
    if max_sandboxes < 0 or max_memory_mb < 0:
        raise InvalidRecord("max_sandboxes/max_memory_mb: must not be negative")
    if not 0 <= max_cpus < float("inf"):  # NaN fails too
        raise InvalidRecord("max_cpus: must be a finite number, not negative")


def check_create_rate(rate_per_s: float | None, burst: int | None) -> None:
    """A tenant's create rate as every store takes it (None: the control plane's default)."""
    if rate_per_s is not None and not 0 < rate_per_s < float("inf"):  # NaN fails too
        raise InvalidRecord("create_rate_per_s: must be a finite number > 0")
    if burst is not None and burst < 1:
        raise InvalidRecord("create_burst: must be >= 1")


def check_pool(size: int | None, max_per_host: int | _Unset | None) -> None:
    """A pool's size and per-host cap as every store takes them (None: unchanged, or no cap)."""
    if size is not None and size < 0:
        raise InvalidRecord("size: must not be negative")
    if isinstance(max_per_host, int) and max_per_host <= 0:
        raise InvalidRecord("max_per_host: must be positive")


def metadata_dict(value: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (value or {}).items()}
