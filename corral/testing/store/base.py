"""What every aggregate of the store model shares: its state, the transaction boundary, and the
bookkeeping more than one aggregate writes (a host's record, ending reservations, writing a sandbox
record with its tenant's counters)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Collection, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace

from corral.core.clock import Clock
from corral.core.scoring import Scorer, ScoreWeights
from corral.core.types import HOST_FACTS, HostFacts, HostState
from corral.store import rows
from corral.store.errors import (
    RecordNotFound,
    StoreUnavailable,
)
from corral.store.records import (
    LIVE_STATES,
    HostRecord,
    PoolRecord,
    ReservationRecord,
    SandboxRecord,
    TemplateRecord,
    TenantRecord,
    Usage,
)

DEFAULT_TEMPLATE = TemplateRecord(
    name="default", cpus=1.0, memory_mb=512, stateful=False, description="built-in: 1 cpu, 512 MiB"
)


@dataclass(slots=True)
class _Entry:
    epoch: int
    present: bool
    changed_at: float


@dataclass(slots=True)
class _Host:
    id: str
    registered_at: float
    heartbeat_at: float = 0.0
    seq: int = 0
    facts: HostFacts = field(default_factory=lambda: HostFacts(0.0, 0.0, 0, 0, 0))
    state: HostState = HostState.READY
    address: str = ""
    warm: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # The listing, as the SQL stores' ``listed_sandboxes`` rows: sandbox id -> an entry; an entry not
    # present went (or was never listed) and stays until pruned, for the reconciler to see it go.
    listing: dict[str, _Entry] = field(default_factory=dict)
    listed_seq: int | None = None
    listed_digest: int = 0
    listed_at: float = 0.0
    listed_count: int = 0
    # Every reservation row of the host, expired-unswept ones included (the SQL stores' counters).
    reserved_mb: int = 0
    reserved_cpu_m: int = 0


@dataclass(slots=True)
class _Tenant:
    record: TenantRecord
    live_sandboxes: int = 0
    live_memory_mb: int = 0
    live_cpu_m: int = 0

    def usage(self) -> Usage:
        return Usage(self.live_sandboxes, self.live_memory_mb, rows.from_millicores(self.live_cpu_m))


@dataclass(eq=False)
class ModelBase:
    """The state of record in memory. ``rng`` draws every id, so a run is a function of its seed."""

    clock: Clock
    rng: random.Random
    _: KW_ONLY
    latency: Callable[[], float] | None = None
    outage: Callable[[], bool] | None = None
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    _scorer: Scorer = field(init=False)  # compiled once: every reserve_best scores with it
    hosts: dict[str, _Host] = field(default_factory=dict, init=False)
    reservations: dict[str, ReservationRecord] = field(default_factory=dict, init=False)
    replicas: dict[str, float] = field(default_factory=dict, init=False)
    # Replica -> when its lapsed lease was last ended.
    leases_ended: dict[str, float] = field(default_factory=dict, init=False)
    leases: dict[str, tuple[str, float]] = field(default_factory=dict, init=False)
    sandboxes: dict[str, SandboxRecord] = field(default_factory=dict, init=False)
    placements: dict[str, str | None] = field(default_factory=dict, init=False)
    tenants: dict[str, _Tenant] = field(default_factory=dict, init=False)
    templates: dict[str, TemplateRecord] = field(
        default_factory=lambda: {DEFAULT_TEMPLATE.name: DEFAULT_TEMPLATE}, init=False
    )
    pools: dict[str, PoolRecord] = field(default_factory=dict, init=False)  # by template
    # (tenant, key) -> (request hash, sandbox id, the record as first created, when)
    idempotency: dict[tuple[str, str], tuple[str | None, str, SandboxRecord, float]] = field(
        default_factory=dict, init=False
    )
    # (host, sandbox) -> the epoch it must reach
    fences: dict[tuple[str, str], int] = field(default_factory=dict, init=False)
    calls: int = field(default=0, init=False)
    refused_calls: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._scorer = Scorer(weights=self.weights)

    async def _enter(self) -> None:
        self.calls += 1
        if self.latency is not None:
            await asyncio.sleep(self.latency())
        if self.outage is not None and self.outage():
            self.refused_calls += 1
            raise StoreUnavailable("the store cannot be reached")

    def _now(self) -> float:
        return self.clock.now()

    def _id(self, bits: int = 128) -> str:
        return f"{self.rng.getrandbits(bits):0{(bits + 3) // 4}x}"

    def _expired_on(self, host_id: str, now: float) -> tuple[int, int]:
        mb = cpu_m = 0
        for r in self.reservations.values():
            if r.host_id == host_id and r.expires_at <= now:
                mb += r.memory_mb
                cpu_m += rows.to_millicores(r.cpu)
        return mb, cpu_m

    def _record(self, h: _Host, now: float) -> HostRecord:
        mb, cpu_m = self._expired_on(h.id, now)
        return HostRecord(
            **{f: getattr(h.facts, f) for f in HOST_FACTS},
            id=h.id,
            heartbeat_at=h.heartbeat_at,
            state=h.state,
            seq=h.seq,
            registered_at=h.registered_at,
            address=h.address,
            reserved_mb=h.reserved_mb - mb,
            reserved_cpu=rows.from_millicores(h.reserved_cpu_m - cpu_m),
            warm=dict(h.warm),
            sandbox_count=h.listed_count,
            listed_seq=h.listed_seq,
            listed_at=h.listed_at,
        )

    def _end(self, ids: Collection[str]) -> int:
        """End each reservation (delete the row, take it off its host's counters); how many ended."""
        n = 0
        for rid in ids:
            r = self.reservations.pop(rid, None)
            if r is None:
                continue
            h = self.hosts.get(r.host_id)
            if h is not None:
                h.reserved_mb -= r.memory_mb
                h.reserved_cpu_m -= rows.to_millicores(r.cpu)
            n += 1
        return n

    def _sandbox(self, sandbox_id: str) -> SandboxRecord:
        """The sandbox's record; :class:`RecordNotFound` when there is none."""
        sb = self.sandboxes.get(sandbox_id)
        if sb is None:
            raise RecordNotFound(f"sandbox {sandbox_id!r}")
        return sb

    def _put(self, sb: SandboxRecord, **changes: object) -> SandboxRecord:
        """Write a record (version plus one), moving its tenant's usage when it crosses live/not."""
        new = replace(sb, version=sb.version + 1, **changes)  # type: ignore[arg-type]
        delta = int(new.state in LIVE_STATES) - int(sb.state in LIVE_STATES)
        self._count(new.tenant_id, delta, delta * new.memory_mb, delta * rows.to_millicores(new.cpus))
        self.sandboxes[sb.id] = new
        return new

    def _count(self, tenant_id: str, n: int, mb: int, cpu_m: int) -> None:
        t = self.tenants.get(tenant_id)
        if t is not None:
            t.live_sandboxes += n
            t.live_memory_mb += mb
            t.live_cpu_m += cpu_m
