"""What the control plane's flows need from the state of record and from the fleet, as narrow
protocols: the create flow, batch creates, failover, the reconciler, warm pools, waiting creates,
heartbeat intake, re-sealing and explanations each depend on the few methods they call, never on the
whole :class:`corral.store.Store`. The SQL stores satisfy them structurally
(:mod:`corral.testing.store.conformance` makes mypy prove it) and so does the in-memory store model, which
is what lets the real flows run on virtual time under injected faults.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from corral.agent.client import AgentClient
from corral.store import (
    UNSET,
    CreateOutcome,
    FailedHost,
    HeartbeatResult,
    HostRecord,
    HostReport,
    ListingChange,
    Page,
    PoolRecord,
    ReservationRecord,
    ReserveItem,
    SandboxRecord,
    SandboxState,
    TemplateRecord,
    Usage,
)
from corral.store.records import _Unset


class HostReader(Protocol):
    async def list_hosts(self) -> list[HostRecord]: ...


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
    ) -> ReservationRecord | None: ...

    async def reserve_best(
        self,
        candidates: Sequence[str],
        *,
        memory_mb: int,
        cpu: float = 0.0,
        owner: str,
        ttl_s: float,
        sandbox_id: str | None = None,
    ) -> ReservationRecord | None: ...

    async def reserve_batch(
        self, items: Sequence[ReserveItem], *, owner: str, ttl_s: float
    ) -> list[ReservationRecord] | None: ...

    async def cancel(self, reservation_id: str) -> bool: ...

    async def sweep_expired(self) -> int: ...

    async def next_expiry(self) -> float | None: ...


class Leases(Protocol):
    """Replica liveness (a reservation ends with its owner's lease) and the single leader."""

    async def renew_replica(self, replica_id: str, ttl_s: float) -> float: ...

    async def expire_replicas(self) -> list[str]: ...

    async def abandoned(self, sandbox_ids: Collection[str]) -> set[str]: ...

    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool: ...


class RecordCreate(Protocol):
    async def create_sandbox(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome: ...


class RecordReads(Protocol):
    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None: ...

    async def get_sandboxes(self, sandbox_ids: Collection[str]) -> dict[str, SandboxRecord]: ...

    async def list_sandboxes(
        self,
        *,
        tenant_id: str | None = None,
        host_id: str | None = None,
        state: SandboxState | Collection[SandboxState] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page: ...


class RecordStates(Protocol):
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
    ) -> SandboxRecord: ...

    async def delete_sandbox(
        self, sandbox_id: str, *, forget_idempotency: bool = False, expect: SandboxState | None = None
    ) -> bool: ...


class SandboxRecords(RecordCreate, RecordReads, RecordStates, Protocol):
    """Sandbox records: written, read, moved between states, deleted."""


class Lifecycle(Protocol):
    """What only the leader does to records: fail a dead host, give a sandbox a new host and epoch,
    find sandboxes past their TTL, forget old idempotency keys."""

    async def fail_host(self, host_id: str, dead_before: float, *, evacuate: bool = False) -> FailedHost: ...

    async def reassign_sandbox(
        self, sandbox_id: str, *, expect_version: int, host_id: str, reservation_id: str, placement: str
    ) -> SandboxRecord: ...

    async def expired_sandboxes(
        self, now: float | None = None, *, limit: int = 100
    ) -> list[SandboxRecord]: ...

    async def purge_idempotency_keys(self, older_than: float) -> int: ...


class Specs(Protocol):
    """What a sandbox is started from: its template and its sealed spec."""

    async def get_template(self, name: str) -> TemplateRecord | None: ...

    async def sealed_spec(self, sandbox_id: str) -> str | None: ...


class Tenants(Protocol):
    async def usage(self, tenant_id: str) -> Usage: ...

    async def committed_mb(self) -> int: ...


class Listings(Protocol):
    """What hosts' heartbeats said they run, as the store holds it: read by what changed since a
    time, never whole, and forgotten once the reconciler has seen entries go."""

    async def listing_disputes(self, since: float) -> list[ListingChange]: ...

    async def listed(self, host_id: str, sandbox_ids: Collection[str]) -> dict[str, int]: ...

    async def listed_hosts(self, sandbox_ids: Collection[str]) -> dict[str, str]: ...

    async def prune_listings(self, before: float) -> int: ...


class ClaimRecords(RecordCreate, Protocol):
    """What a warm claim writes through: the create's checks first, as a read (a warm sandbox once
    handed over cannot be given back), then the record."""

    async def check_create(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome | None: ...


class PoolReader(Protocol):
    """The pools' intent and the templates they are of, as a replica reads them."""

    async def list_pools(self) -> list[PoolRecord]: ...

    async def list_templates(self) -> list[TemplateRecord]: ...


class PoolStore(PoolReader, Protocol):
    """The admin's pools and the leader's per-host targets for them."""

    async def create_pool(
        self, template: str, *, size: int, max_per_host: int | None = None
    ) -> PoolRecord: ...

    async def update_pool(
        self, template: str, *, size: int | None = None, max_per_host: int | _Unset | None = UNSET
    ) -> PoolRecord: ...

    async def delete_pool(self, template: str) -> bool: ...

    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool: ...


class WaitingQueue(RecordReads, RecordStates, Protocol):
    """Creates parked for capacity: parked, looked at, ended; placing one goes through the create flow."""

    async def park_sandbox(self, sandbox_id: str, wait_until: float) -> SandboxRecord: ...


class HeartbeatSink(Protocol):
    """What an agent's heartbeat writes: its host's facts and listing, and the OOM kills it saw."""

    async def upsert_heartbeat(self, hb: HostReport) -> HeartbeatResult: ...

    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None: ...


class SealedSpecs(Protocol):
    """Every sealed spec, page by page, and its compare-and-set (re-sealing under a new key)."""

    async def sealed_specs(self, after_id: str, limit: int) -> list[tuple[str, str]]: ...

    async def replace_sealed_spec(self, sandbox_id: str, old: str, new: str) -> bool: ...


class Placements(Protocol):
    """The explanation stored with a sandbox's placement."""

    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None: ...


class CreatePort(SandboxRecords, Reservations, Specs, Protocol):
    """What the create flow (and batch creates) write through."""


class FailoverPort(CreatePort, Lifecycle, Protocol):
    """What failover writes through: placement as a create gets it, plus the leader's lifecycle."""


class ReconcilePort(FailoverPort, Leases, Listings, Tenants, Protocol):
    """What the reconciler, the leader's loop, writes through."""


class AgentLookup(Protocol):
    """Where a host's agent is reached."""

    def client(self, host_id: str, address: str) -> AgentClient: ...
