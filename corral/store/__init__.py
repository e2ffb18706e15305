"""corral.store: the state of record. One contract (:class:`Store`), two backends: SQLite (the embedded
default: one machine, nothing to install) and PostgreSQL (a fleet that outgrows one machine).

    store = open_store("sqlite:///var/lib/corral/corral.db")   # or "postgresql://user@host:5432/db"
    await store.migrate()
"""

from __future__ import annotations

from corral.core.clock import Clock
from corral.images.blobs import BlobStore
from corral.store.contract import Store
from corral.store.errors import (
    DomainTaken,
    HostHasSandboxes,
    IdempotencyMismatch,
    InvalidRecord,
    NameConflict,
    QuotaExceeded,
    RecordNotFound,
    StateConflict,
    StoreError,
    StoreUnavailable,
    TenantHasSandboxes,
    TokenRevoked,
)
from corral.store.records import (
    DEFAULT_MAX_CPUS,
    FAILOVER_ORPHAN,
    FAILOVER_POLICIES,
    FAILOVER_RECREATE,
    LIVE_STATES,
    MAX_SUMMARIES,
    UNSET,
    ChangeRecord,
    CreateOutcome,
    DomainRecord,
    FailedHost,
    HeartbeatResult,
    HostRecord,
    HostReport,
    Listing,
    ListingChange,
    Page,
    PoolRecord,
    Principal,
    ReservationRecord,
    ReserveItem,
    Role,
    SandboxRecord,
    SandboxState,
    SandboxSummary,
    TemplateRecord,
    TenantRecord,
    TokenRecord,
    Usage,
    disputed,
    from_millicores,
    to_millicores,
)


def open_store(url: str, *, clock: Clock | None = None) -> Store:
    """A store for ``url``; nothing is connected until first use. Call ``await store.migrate()`` once
    at start-up.

    - ``sqlite:///relative/or/absolute/path.db`` (``sqlite:////abs/path.db`` also works), or
      ``sqlite://:memory:`` for one process's private store.
    - ``postgresql://user:pass@host:port/db``; corral's own query parameters: ``schema=NAME`` (tables
      live in that schema, created by ``migrate``) and ``pool_size=N`` (default 10). Any other
      parameter goes to libpq.
    """
    if url.startswith("sqlite:"):
        from corral.store.sqlite import SqliteStore

        return SqliteStore.from_url(url, clock=clock)
    if url.startswith(("postgresql:", "postgres:")):
        from corral.store.postgres import PostgresStore

        return PostgresStore.from_url(url, clock=clock)
    raise InvalidRecord(f"unsupported store URL {url!r}: expected sqlite:///path or postgresql://...")


def own_blobs(store: Store) -> BlobStore | None:
    """The blob store a store keeps in its own tables: PostgreSQL's (every replica serves every image
    from it). None for SQLite: one machine keeps its images in a directory (``DirBlobStore``) instead of
    holding the database's one writer through every image's bytes."""
    if getattr(store, "dialect", None) != "postgres":
        return None
    from corral.store.blobs import PostgresBlobStore
    from corral.store.postgres import PostgresStore

    # A wrapper that only passes PostgreSQL's dialect on (a test's fault injection) keeps none.
    return PostgresBlobStore(store) if isinstance(store, PostgresStore) else None


__all__ = [
    "DEFAULT_MAX_CPUS",
    "FAILOVER_ORPHAN",
    "FAILOVER_POLICIES",
    "FAILOVER_RECREATE",
    "LIVE_STATES",
    "MAX_SUMMARIES",
    "UNSET",
    "ChangeRecord",
    "CreateOutcome",
    "DomainRecord",
    "DomainTaken",
    "FailedHost",
    "HeartbeatResult",
    "HostHasSandboxes",
    "HostRecord",
    "HostReport",
    "IdempotencyMismatch",
    "InvalidRecord",
    "Listing",
    "ListingChange",
    "NameConflict",
    "Page",
    "PoolRecord",
    "Principal",
    "QuotaExceeded",
    "RecordNotFound",
    "ReservationRecord",
    "ReserveItem",
    "Role",
    "SandboxRecord",
    "SandboxState",
    "SandboxSummary",
    "StateConflict",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "TemplateRecord",
    "TenantHasSandboxes",
    "TenantRecord",
    "TokenRecord",
    "TokenRevoked",
    "Usage",
    "disputed",
    "from_millicores",
    "open_store",
    "own_blobs",
    "to_millicores",
]
