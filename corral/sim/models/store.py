"""The state of record in memory, with the SQL stores' semantics for what the control plane's flows
call (:mod:`corral.control.ports`): reservations against a host's admittable and CPU (the core's fit
rule, spread score and tie-break), ended exactly once, expired by TTL and with their owner's lease;
sandbox records with quota counters, name uniqueness and idempotency keys; heartbeats whose listings
carry changes on a base with a digest (applied exactly as :mod:`corral.store.listings` applies them),
fences and failover; parked creates, OOM kills, sealed specs and warm pools' intent.

Every method is one "transaction": it may await (a latency, an outage) only before it reads anything,
then runs to completion without yielding, as a serialisable transaction would. ``outage`` makes every
call raise :class:`StoreUnavailable` while it returns true, as a database that cannot be reached.
A property test holds this model to the SQLite store on random sequences of operations.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from corral.core.admission import host_fits
from corral.core.clock import Clock
from corral.core.fit import TAKES_STATE, tie_rank
from corral.core.listing import digest_of, fold
from corral.core.scoring import Scorer, ScoreWeights
from corral.core.types import HOST_FACTS, CreateRequest, HostFacts, HostState, HostView, Pending
from corral.store import rows
from corral.store.errors import (
    IdempotencyMismatch,
    InvalidRecord,
    NameConflict,
    RecordNotFound,
    StateConflict,
    StoreUnavailable,
)
from corral.store.records import (
    DEFAULT_MAX_CPUS,
    FAILOVER_POLICIES,
    LIVE_STATES,
    UNSET,
    CreateOutcome,
    FailedHost,
    HeartbeatResult,
    HostRecord,
    HostReport,
    Listing,
    ListingChange,
    Page,
    PoolRecord,
    ReservationRecord,
    ReserveItem,
    SandboxRecord,
    SandboxState,
    TemplateRecord,
    TenantRecord,
    Usage,
    _Unset,
    as_states,
    check_pool,
    check_quota,
    check_tenant_quota,
    disputed,
    metadata_dict,
)

MAX_PAGE = 1000
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


def _check_reservation(memory_mb: int, cpu: float, ttl_s: float) -> None:
    if memory_mb < 0 or cpu < 0:
        raise InvalidRecord("a reservation cannot be negative")
    if memory_mb == 0:
        # The core's rule reads a request, which asks for some memory; no flow claims none.
        raise InvalidRecord("memory_mb: the model takes claims of at least 1 MiB")
    if not ttl_s > 0:
        raise InvalidRecord("ttl_s: must be positive")


def _ask(memory_mb: int, cpu_m: int) -> CreateRequest:
    """A claim as the core's rule reads it: stateful, so its charge is its memory in any admission
    mode (the store charges a claim what it says), and its CPU in whole millicores as stored."""
    return CreateRequest(memory_mb=memory_mb, cpu=rows.from_millicores(cpu_m), stateful=True)


def _check_sandbox(r: SandboxRecord) -> None:
    if not r.id or not r.tenant_id:
        raise InvalidRecord("id/tenant_id: must not be empty")
    if r.memory_mb <= 0 or r.cpus < 0:
        raise InvalidRecord("memory_mb must be positive, cpus not negative")
    if r.name is not None and not r.name:
        raise InvalidRecord("name: must not be empty (use None for no name)")
    if r.failover not in FAILOVER_POLICIES:
        raise InvalidRecord(f"failover: one of {', '.join(FAILOVER_POLICIES)}")


class ModelStore:
    """See the module docstring. ``rng`` draws every id, so a run is a function of its seed."""

    def __init__(
        self,
        clock: Clock,
        rng: random.Random,
        *,
        latency: Callable[[], float] | None = None,
        outage: Callable[[], bool] | None = None,
        weights: ScoreWeights = ScoreWeights(),
    ) -> None:
        self.clock = clock
        self.rng = rng
        self.latency = latency
        self.outage = outage
        self.weights = weights
        self._scorer = Scorer(weights=weights)  # compiled once: every reserve_best scores with it
        self.hosts: dict[str, _Host] = {}
        self.reservations: dict[str, ReservationRecord] = {}
        self.replicas: dict[str, float] = {}
        self.leases_ended: dict[str, float] = {}  # replica -> when its lapsed lease was last ended
        self.leases: dict[str, tuple[str, float]] = {}
        self.sandboxes: dict[str, SandboxRecord] = {}
        self.placements: dict[str, str | None] = {}
        self.tenants: dict[str, _Tenant] = {}
        self.templates: dict[str, TemplateRecord] = {DEFAULT_TEMPLATE.name: DEFAULT_TEMPLATE}
        self.pools: dict[str, PoolRecord] = {}  # by template
        # (tenant, key) -> (request hash, sandbox id, the record as first created, when)
        self.idempotency: dict[tuple[str, str], tuple[str | None, str, SandboxRecord, float]] = {}
        self.fences: dict[tuple[str, str], int] = {}  # (host, sandbox) -> the epoch it must reach
        self.calls = 0
        self.refused_calls = 0

    # -- the transaction boundary ------------------------------------------------------------------

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

    # -- hosts ---------------------------------------------------------------------------------------

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

    async def register_host(self, host_id: str, *, address: str = "", role: str = "worker") -> HostRecord:
        await self._enter()
        now = self._now()
        h = self.hosts.get(host_id)
        if h is None:
            h = self.hosts[host_id] = _Host(host_id, registered_at=now, address=address)
        else:
            h.address = address or h.address
        h.facts = replace(h.facts, role=role)
        return self._record(h, now)

    async def list_hosts(self) -> list[HostRecord]:
        await self._enter()
        now = self._now()
        return [self._record(self.hosts[h], now) for h in sorted(self.hosts)]

    async def get_host(self, host_id: str) -> HostRecord | None:
        await self._enter()
        h = self.hosts.get(host_id)
        return self._record(h, self._now()) if h is not None else None

    async def drain(self, host_id: str) -> HostRecord:
        await self._enter()
        h = self.hosts.get(host_id)
        if h is None:
            raise RecordNotFound(f"host {host_id!r}")
        h.state = HostState.DRAINING
        return self._record(h, self._now())

    async def upsert_heartbeat(self, hb: HostReport) -> HeartbeatResult:
        await self._enter()
        if not hb.host_id:
            raise InvalidRecord("host_id: must not be empty")
        now = self._now()
        h = self.hosts.get(hb.host_id)
        applied = h is None or h.seq < hb.seq
        if h is None:
            h = self.hosts[hb.host_id] = _Host(hb.host_id, registered_at=now)
        confirmed = 0
        fenced: frozenset[str] = frozenset()
        if applied:
            h.address = hb.address or h.address
            h.heartbeat_at, h.seq = now, hb.seq
            h.facts, h.warm = hb.facts.facts(), dict(hb.warm)
            listed = self._apply(h, hb, now)
            confirmed = self._end(self._confirmable(h, hb))
            if listed:
                fenced = self._fences(h)
        return HeartbeatResult(self._record(h, now), applied, confirmed, fenced)

    # -- listings: :mod:`corral.store.listings`, statement for statement -----------------------------

    @staticmethod
    def _held(h: _Host, sandbox_ids: Collection[str]) -> dict[str, int]:
        return {sid: e.epoch for sid in sandbox_ids if (e := h.listing.get(sid)) is not None and e.present}

    @staticmethod
    def _write_entries(h: _Host, entries: Sequence[tuple[str, int, bool]], now: float) -> None:
        for sid, epoch, present in entries:
            h.listing[sid] = _Entry(epoch, present, now)

    def _apply(self, h: _Host, hb: HostReport, now: float) -> bool:
        listing = hb.listing
        if listing.base is None:
            self._replace(h, listing, now)
        elif listing.base != h.listed_seq:
            return False  # built on a listing the store does not hold: the whole set must come
        else:
            old = self._held(h, listing.removed | listing.entries.keys())
            digest = fold(fold(h.listed_digest, old.items()), listing.entries.items())
            if listing.digest is not None and digest != listing.digest:
                h.listed_seq = None  # the copies disagree: untrusted until the whole set comes
                return False
            gone = sorted(listing.removed - listing.entries.keys())
            came = sorted((sid, e) for sid, e in listing.entries.items() if old.get(sid) != e)
            self._write_entries(h, [(sid, old.get(sid, 0), False) for sid in gone], now)
            self._write_entries(h, [(sid, e, True) for sid, e in came], now)
            h.listed_count += len(listing.entries.keys() - old.keys()) - sum(1 for sid in gone if sid in old)
            h.listed_seq, h.listed_digest, h.listed_at = hb.seq, digest, now
            return True
        h.listed_seq, h.listed_digest, h.listed_at = hb.seq, digest_of(listing.entries), now
        h.listed_count = len(listing.entries)
        return True

    def _replace(self, h: _Host, listing: Listing, now: float) -> None:
        """A whole set: see :func:`corral.store.listings._replace`."""
        untrusted = h.listed_seq is None
        if untrusted or listing.digest is None or listing.digest != h.listed_digest:
            if untrusted:
                h.listing.clear()
            before = {sid: e.epoch for sid, e in h.listing.items() if e.present}
            came = [(sid, e, True) for sid, e in sorted(listing.entries.items()) if before.get(sid) != e]
            gone = [(sid, e, False) for sid, e in sorted(before.items()) if sid not in listing.entries]
            self._write_entries(h, came + gone, now)
        for sb in self.sandboxes.values():
            if sb.host_id == h.id and sb.state is SandboxState.RUNNING and sb.id not in h.listing:
                h.listing[sb.id] = _Entry(sb.epoch, False, now)

    def _confirmable(self, h: _Host, hb: HostReport) -> list[str]:
        outstanding = [
            r for r in self.reservations.values() if r.host_id == h.id and r.sandbox_id is not None
        ]
        shown = self._held(h, {r.sandbox_id for r in outstanding if r.sandbox_id is not None})
        return sorted(
            r.id for r in outstanding if r.sandbox_id in shown or r.sandbox_id in hb.listing.entries
        )

    def _fences(self, h: _Host) -> frozenset[str]:
        got = {sid: e for (host, sid), e in self.fences.items() if host == h.id}
        listed = self._held(h, got)
        fenced = frozenset(sid for sid, epoch in got.items() if sid in listed and listed[sid] < epoch)
        for sid in got:
            if sid not in fenced:
                del self.fences[(h.id, sid)]
        return fenced

    async def listing_changes(self, since: float) -> list[ListingChange]:
        await self._enter()
        got = [
            ListingChange(h.id, sid, e.present, e.changed_at)
            for h in self.hosts.values()
            for sid, e in h.listing.items()
            if e.changed_at >= since
        ]
        return sorted(got, key=lambda c: (c.changed_at, c.host_id, c.sandbox_id))

    async def listing_disputes(self, since: float) -> list[ListingChange]:
        return [c for c in await self.listing_changes(since) if disputed(c, self.sandboxes.get(c.sandbox_id))]

    async def listed(self, host_id: str, sandbox_ids: Collection[str]) -> dict[str, int]:
        await self._enter()
        h = self.hosts.get(host_id)
        return self._held(h, sandbox_ids) if h is not None else {}

    async def listed_hosts(self, sandbox_ids: Collection[str]) -> dict[str, str]:
        await self._enter()
        wanted = set(sandbox_ids)
        return {
            sid: h.id
            for h in sorted(self.hosts.values(), key=lambda h: h.id)
            for sid, e in h.listing.items()
            if e.present and sid in wanted
        }

    async def prune_listings(self, before: float) -> int:
        await self._enter()
        n = 0
        for h in self.hosts.values():
            old = [sid for sid, e in h.listing.items() if not e.present and e.changed_at < before]
            for sid in old:
                del h.listing[sid]
            n += len(old)
        return n

    async def committed_mb(self) -> int:
        await self._enter()
        return sum(t.live_memory_mb for t in self.tenants.values())

    async def fail_host(self, host_id: str, dead_before: float, *, evacuate: bool = False) -> FailedHost:
        await self._enter()
        now = self._now()
        h = self.hosts.get(host_id)
        if h is None:
            return FailedHost(0, 0, 0)
        silent = h.heartbeat_at < dead_before
        if not silent and not (evacuate and h.state is HostState.DRAINING):
            return FailedHost(0, 0, 0)
        recreating = orphaned = released = 0
        for sb in list(self.sandboxes.values()):
            if sb.host_id == host_id and sb.state is SandboxState.RUNNING and sb.failover == "recreate":
                self._put(sb, state=SandboxState.RECREATING, updated_at=now)
                recreating += 1
        if silent:
            for sb in list(self.sandboxes.values()):
                if sb.host_id == host_id and sb.state is SandboxState.RUNNING:
                    self._put(sb, state=SandboxState.ORPHANED, updated_at=now)
                    orphaned += 1
            released = self._end([r.id for r in self.reservations.values() if r.host_id == host_id])
        return FailedHost(orphaned, recreating, released)

    async def reassign_sandbox(
        self, sandbox_id: str, *, expect_version: int, host_id: str, reservation_id: str, placement: str
    ) -> SandboxRecord:
        await self._enter()
        now = self._now()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None:
            raise RecordNotFound(f"sandbox {sandbox_id!r}")
        if sb.version != expect_version or sb.state is not SandboxState.RECREATING:
            raise StateConflict(sandbox_id, sb.state, sb.version)
        before = sb.host_id
        rec = self._put(
            sb,
            host_id=host_id,
            epoch=sb.epoch + 1,
            recreated_at=now,
            updated_at=now,
            reservation_id=reservation_id,
        )
        self.placements[sandbox_id] = placement
        hosts = {host for (host, sid) in self.fences if sid == sandbox_id}
        if before:
            hosts.add(before)
        hosts.discard(host_id)
        for key in [k for k in self.fences if k[1] == sandbox_id]:
            del self.fences[key]
        for host in sorted(hosts):
            self.fences[(host, sandbox_id)] = rec.epoch
        return rec

    # -- reservations --------------------------------------------------------------------------------

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

    def _fold_expired(self, host_ids: Collection[str], now: float) -> int:
        hosts = set(host_ids)
        return self._end(
            [r.id for r in self.reservations.values() if r.host_id in hosts and r.expires_at <= now]
        )

    def _pending(self, h: _Host, expired: tuple[int, int] = (0, 0)) -> Pending:
        """What the host's counters hold, with ``expired`` (MiB, millicores) set aside."""
        return Pending(h.reserved_mb - expired[0], rows.from_millicores(h.reserved_cpu_m - expired[1]))

    @staticmethod
    def _view(h: _Host) -> HostView:
        return HostView(
            **{f: getattr(h.facts, f) for f in HOST_FACTS},
            id=h.id,
            heartbeat_at=h.heartbeat_at,
            state=h.state,
        )

    def _room(self, h: _Host, ask: CreateRequest, expired: tuple[int, int] = (0, 0)) -> bool:
        """The core's whole fit rule on the host's counters, as the SQL stores render it."""
        return h.state is TAKES_STATE and host_fits(self._view(h), self._pending(h, expired), ask)

    def _take(self, r: ReservationRecord) -> None:
        h = self.hosts[r.host_id]
        h.reserved_mb += r.memory_mb
        h.reserved_cpu_m += rows.to_millicores(r.cpu)
        self.reservations[r.id] = r

    def _new_reservation(
        self, host_id: str, memory_mb: int, cpu: float, owner: str, ttl_s: float, sandbox_id: str | None
    ) -> ReservationRecord:
        now = self._now()
        return ReservationRecord(
            id=self._id(),
            host_id=host_id,
            memory_mb=memory_mb,
            cpu=rows.from_millicores(rows.to_millicores(cpu)),
            owner=owner,
            sandbox_id=sandbox_id,
            created_at=now,
            expires_at=now + ttl_s,
        )

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
        _check_reservation(memory_mb, cpu, ttl_s)
        await self._enter()
        r = self._new_reservation(host_id, memory_mb, cpu, owner, ttl_s, sandbox_id)
        h = self.hosts.get(host_id)
        if h is None:
            return None
        ask = _ask(memory_mb, rows.to_millicores(cpu))
        if not self._room(h, ask):
            # Expired reservations are folded only when nothing fits without them.
            self._fold_expired([host_id], r.created_at)
            if not self._room(h, ask):
                return None
        self._take(r)
        return r

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
        _check_reservation(memory_mb, cpu, ttl_s)
        if not candidates:
            return None
        await self._enter()
        template = self._new_reservation("", memory_mb, cpu, owner, ttl_s, sandbox_id)
        ask = _ask(memory_mb, rows.to_millicores(cpu))
        salt = sandbox_id or template.id
        # Ranked by live totals, as the core ranks: the candidates' expired claims end first.
        self._fold_expired(candidates, template.created_at)
        fit = [
            self.hosts[i]
            for i in sorted(set(candidates))
            if i in self.hosts and self._room(self.hosts[i], ask)
        ]
        if not fit:
            return None
        scorer = self._scorer
        h = min(
            fit,
            key=lambda h: (-scorer.score(self._view(h), self._pending(h), ask), tie_rank(salt, h.id), h.id),
        )
        r = replace(template, host_id=h.id)
        self._take(r)
        return r

    async def reserve_batch(
        self, items: Sequence[ReserveItem], *, owner: str, ttl_s: float
    ) -> list[ReservationRecord] | None:
        if not items:
            return []
        for it in items:
            _check_reservation(it.memory_mb, it.cpu, ttl_s)
        await self._enter()
        records = [
            self._new_reservation(i.host_id, i.memory_mb, i.cpu, owner, ttl_s, i.sandbox_id) for i in items
        ]
        need: dict[str, tuple[int, int]] = {}
        for r in records:
            mb, cpu_m = need.get(r.host_id, (0, 0))
            need[r.host_id] = (mb + r.memory_mb, cpu_m + rows.to_millicores(r.cpu))
        now = records[0].created_at
        for host_id, (mb, cpu_m) in sorted(need.items()):
            h = self.hosts.get(host_id)
            # As if the host's expired reservations were folded first: a batch refused rolls back
            # everything, the fold included.
            if h is None or not self._room(h, _ask(mb, cpu_m), self._expired_on(host_id, now)):
                return None
        self._fold_expired(need, now)
        for r in records:
            self._take(r)
        return records

    async def cancel(self, reservation_id: str) -> bool:
        await self._enter()
        return self._end([reservation_id]) > 0

    async def confirm(self, reservation_id: str) -> bool:
        await self._enter()
        return self._end([reservation_id]) > 0

    async def get_reservation(self, reservation_id: str) -> ReservationRecord | None:
        await self._enter()
        return self.reservations.get(reservation_id)

    async def sweep_expired(self) -> int:
        await self._enter()
        now = self._now()
        return self._end([r.id for r in self.reservations.values() if r.expires_at <= now])

    async def drop_owner(self, owner: str) -> int:
        await self._enter()
        return self._end([r.id for r in self.reservations.values() if r.owner == owner])

    async def next_expiry(self) -> float | None:
        await self._enter()
        now = self._now()
        return min((r.expires_at for r in self.reservations.values() if r.expires_at > now), default=None)

    # -- leases --------------------------------------------------------------------------------------

    async def renew_replica(self, replica_id: str, ttl_s: float) -> float:
        if not ttl_s > 0:
            raise InvalidRecord("ttl_s: must be positive")
        await self._enter()
        self.replicas[replica_id] = expires_at = self._now() + ttl_s
        return expires_at

    async def expire_replicas(self) -> list[str]:
        await self._enter()
        now = self._now()
        lapsed = sorted(r for r, exp in self.replicas.items() if exp <= now)
        for replica_id in lapsed:
            self._end([r.id for r in self.reservations.values() if r.owner == replica_id])
            del self.replicas[replica_id]
            self.leases_ended[replica_id] = now
        return lapsed

    async def abandoned(self, sandbox_ids: Collection[str]) -> set[str]:
        await self._enter()
        now = self._now()
        out = set()
        for sid in set(sandbox_ids):
            sb = self.sandboxes.get(sid)
            if sb is None or sb.state is not SandboxState.RESERVED or sb.owner is None:
                continue
            if self.replicas.get(sb.owner, now) <= now:
                out.add(sid)
        return out

    async def try_lead(self, name: str, holder: str, ttl_s: float) -> bool:
        if not ttl_s > 0:
            raise InvalidRecord("ttl_s: must be positive")
        await self._enter()
        now = self._now()
        held = self.leases.get(name)
        if held is not None and held[0] != holder and held[1] > now:
            return False
        self.leases[name] = (holder, now + ttl_s)
        return True

    # -- sandboxes -----------------------------------------------------------------------------------

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

    def _name_taken(self, tenant_id: str, name: str | None, other_than: str) -> str | None:
        if name is None:
            return None
        for sb in self.sandboxes.values():
            if (
                sb.tenant_id == tenant_id
                and sb.name == name
                and sb.state is not SandboxState.DELETED
                and sb.id != other_than
            ):
                return sb.id
        return None

    def _create_checks(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome | None:
        """Idempotency, name and quota, in the SQL stores' order: a replay's outcome, or None when
        the record may be inserted."""
        t = self.tenants.get(record.tenant_id)
        if t is None:
            raise RecordNotFound(f"tenant {record.tenant_id!r}")
        if idempotency_key is not None:
            seen = self.idempotency.get((record.tenant_id, idempotency_key))
            if seen is not None:
                if seen[0] is not None and request_hash is not None and seen[0] != request_hash:
                    raise IdempotencyMismatch(
                        f"idempotency key {idempotency_key!r} was first used with a different request"
                    )
                return CreateOutcome(self.sandboxes.get(seen[1]) or seen[2], replayed=True)
        taken = self._name_taken(record.tenant_id, record.name, "")
        if taken is not None:
            raise NameConflict(f"name {record.name!r} is taken by sandbox {taken}")
        if SandboxState(record.state) in LIVE_STATES:
            check_quota(t.record, t.usage(), record.memory_mb, record.cpus)
        return None

    async def create_sandbox(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome:
        _check_sandbox(record)
        await self._enter()
        now = self._now()
        replay = self._create_checks(record, idempotency_key, request_hash)
        if replay is not None:
            return replay
        state = SandboxState(record.state)
        if record.id in self.sandboxes:
            raise NameConflict(f"sandbox {record.id!r} (or its name) already exists")
        rec = replace(
            record,
            state=state,
            metadata=metadata_dict(record.metadata),
            created_at=now,
            updated_at=now,
            version=1,
            oom_kills=0,
            recreated_at=None,
            wait_until=None,
        )
        self.sandboxes[rec.id] = rec
        self.placements[rec.id] = None
        if state in LIVE_STATES:
            self._count(rec.tenant_id, 1, rec.memory_mb, rows.to_millicores(rec.cpus))
        if idempotency_key is not None:
            self.idempotency[(rec.tenant_id, idempotency_key)] = (request_hash, rec.id, rec, now)
        return CreateOutcome(rec, replayed=False)

    async def purge_idempotency_keys(self, older_than: float) -> int:
        await self._enter()
        old = [k for k, v in self.idempotency.items() if v[3] < older_than]
        for k in old:
            del self.idempotency[k]
        return len(old)

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
        try:
            new_state = SandboxState(state)
            expected = as_states(expect)
        except ValueError as exc:
            raise InvalidRecord(f"state: {exc}") from exc
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None:
            raise RecordNotFound(f"sandbox {sandbox_id!r}")
        if (expected is not None and sb.state not in expected) or (
            expect_version is not None and sb.version != expect_version
        ):
            raise StateConflict(sandbox_id, sb.state, sb.version)
        if (
            sb.state is SandboxState.DELETED
            and new_state is not SandboxState.DELETED
            and self._name_taken(sb.tenant_id, sb.name, sb.id) is not None
        ):
            raise NameConflict(f"sandbox {sandbox_id!r}: its name is taken by a live sandbox")
        changes: dict[str, object] = {"state": new_state, "updated_at": self._now()}
        if not isinstance(host_id, _Unset):
            changes["host_id"] = host_id
        if not isinstance(reservation_id, _Unset):
            changes["reservation_id"] = reservation_id
        if not isinstance(placement, _Unset):
            self.placements[sandbox_id] = placement
        return self._put(sb, **changes)

    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None or (tenant_id is not None and sb.tenant_id != tenant_id):
            return None
        return sb

    async def get_sandboxes(self, sandbox_ids: Collection[str]) -> dict[str, SandboxRecord]:
        await self._enter()
        return {sid: self.sandboxes[sid] for sid in sandbox_ids if sid in self.sandboxes}

    async def list_sandboxes(
        self,
        *,
        tenant_id: str | None = None,
        host_id: str | None = None,
        state: SandboxState | Collection[SandboxState] | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        if not 1 <= limit <= MAX_PAGE:
            raise InvalidRecord(f"limit: must be 1..{MAX_PAGE}")
        try:
            states = as_states(state)
        except ValueError as exc:
            raise InvalidRecord(f"state: {exc}") from exc
        after = rows.decode_cursor(cursor) if cursor is not None else None
        await self._enter()
        got = sorted(
            (
                sb
                for sb in self.sandboxes.values()
                if (tenant_id is None or sb.tenant_id == tenant_id)
                and (host_id is None or sb.host_id == host_id)
                and (states is None or sb.state in states)
                and (after is None or (sb.created_at, sb.id) > after)
            ),
            key=lambda sb: (sb.created_at, sb.id),
        )
        if len(got) <= limit:
            return Page(got, None)
        last = got[limit - 1]
        return Page(got[:limit], rows.encode_cursor(last.created_at, last.id))

    async def delete_sandbox(
        self, sandbox_id: str, *, forget_idempotency: bool = False, expect: SandboxState | None = None
    ) -> bool:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is not None and expect is not None and sb.state is not SandboxState(expect):
            return False
        if forget_idempotency and (sb is not None or expect is None):
            for k in [k for k, v in self.idempotency.items() if v[1] == sandbox_id]:
                del self.idempotency[k]
        self.sandboxes.pop(sandbox_id, None)
        self.placements.pop(sandbox_id, None)
        if sb is None:
            return False
        if sb.state in LIVE_STATES:
            self._count(sb.tenant_id, -1, -sb.memory_mb, -rows.to_millicores(sb.cpus))
        return True

    async def expired_sandboxes(self, now: float | None = None, *, limit: int = 100) -> list[SandboxRecord]:
        await self._enter()
        at = self._now() if now is None else now
        got = [
            sb
            for sb in self.sandboxes.values()
            if sb.expires_at is not None and sb.expires_at <= at and sb.state in LIVE_STATES
        ]
        got.sort(key=lambda sb: (sb.expires_at or 0.0, sb.id))
        return got[:limit]

    async def sealed_spec(self, sandbox_id: str) -> str | None:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        return sb.sealed_spec if sb is not None else None

    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None or (tenant_id is not None and sb.tenant_id != tenant_id):
            raise RecordNotFound(f"sandbox {sandbox_id!r}")
        return self.placements.get(sandbox_id)

    async def check_create(
        self,
        record: SandboxRecord,
        *,
        idempotency_key: str | None = None,
        request_hash: str | None = None,
    ) -> CreateOutcome | None:
        _check_sandbox(record)
        await self._enter()
        return self._create_checks(record, idempotency_key, request_hash)

    async def park_sandbox(self, sandbox_id: str, wait_until: float) -> SandboxRecord:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None:
            raise RecordNotFound(f"sandbox {sandbox_id!r}")
        if sb.state is not SandboxState.RESERVED:
            raise StateConflict(sandbox_id, sb.state, sb.version)
        return self._put(
            sb,
            state=SandboxState.WAITING_CAPACITY,
            wait_until=wait_until,
            host_id=None,
            reservation_id=None,
            updated_at=self._now(),
        )

    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None:
        if not counts:
            return
        await self._enter()
        for sandbox_id, n in sorted(counts.items()):
            sb = self.sandboxes.get(sandbox_id)
            if sb is not None and sb.host_id == host_id and sb.oom_kills < n:
                self.sandboxes[sandbox_id] = replace(sb, oom_kills=n)  # not a state change: no version

    async def sealed_specs(self, after_id: str, limit: int) -> list[tuple[str, str]]:
        await self._enter()
        got = sorted(
            (sid, sb.sealed_spec)
            for sid, sb in self.sandboxes.items()
            if sid > after_id and sb.sealed_spec is not None
        )
        return got[:limit]

    async def replace_sealed_spec(self, sandbox_id: str, old: str, new: str) -> bool:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None or sb.sealed_spec != old:
            return False
        self.sandboxes[sandbox_id] = replace(sb, sealed_spec=new)  # not a state change: no version
        return True

    # -- tenants, templates --------------------------------------------------------------------------

    async def create_tenant(
        self, name: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float = DEFAULT_MAX_CPUS
    ) -> TenantRecord:
        if not name:
            raise InvalidRecord("name: must not be empty")
        check_tenant_quota(max_sandboxes, max_memory_mb, max_cpus)
        await self._enter()
        if any(t.record.name == name for t in self.tenants.values()):
            raise NameConflict(f"tenant {name!r} exists")
        cpus = rows.from_millicores(rows.to_millicores(max_cpus))  # as stored
        rec = TenantRecord("tn_" + self._id(64), name, max_sandboxes, max_memory_mb, self._now(), cpus)
        self.tenants[rec.id] = _Tenant(rec)
        return rec

    async def usage(self, tenant_id: str) -> Usage:
        await self._enter()
        t = self.tenants.get(tenant_id)
        return t.usage() if t is not None else Usage(0, 0, 0.0)

    async def get_template(self, name: str) -> TemplateRecord | None:
        await self._enter()
        return self.templates.get(name)

    async def create_template(self, template: TemplateRecord) -> TemplateRecord:
        await self._enter()
        if template.name in self.templates:
            raise NameConflict(f"template {template.name!r} exists")
        self.templates[template.name] = rec = replace(template, created_at=self._now())
        return rec

    async def list_templates(self) -> list[TemplateRecord]:
        await self._enter()
        return [self.templates[n] for n in sorted(self.templates)]

    # -- warm pools' intent (what the control plane's pool classes write through) --------------------

    async def create_pool(self, template: str, *, size: int, max_per_host: int | None = None) -> PoolRecord:
        check_pool(size, max_per_host)
        await self._enter()
        if template not in self.templates:
            raise RecordNotFound(f"template {template!r}")
        if template in self.pools:
            raise NameConflict(f"template {template!r} already has a pool")
        now = self._now()
        self.pools[template] = rec = PoolRecord(template, size, max_per_host, {}, now, now)
        return rec

    async def update_pool(
        self, template: str, *, size: int | None = None, max_per_host: int | _Unset | None = UNSET
    ) -> PoolRecord:
        check_pool(size, max_per_host)
        await self._enter()
        pool = self.pools.get(template)
        if pool is None:
            raise RecordNotFound(f"no pool for template {template!r}")
        pool = replace(pool, updated_at=self._now())
        if size is not None:
            pool = replace(pool, size=size)
        if not isinstance(max_per_host, _Unset):
            pool = replace(pool, max_per_host=max_per_host)
        self.pools[template] = pool
        return pool

    async def delete_pool(self, template: str) -> bool:
        await self._enter()
        return self.pools.pop(template, None) is not None

    async def list_pools(self) -> list[PoolRecord]:
        await self._enter()
        return [self.pools[t] for t in sorted(self.pools)]

    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool:
        if any(n < 0 for n in targets.values()):
            raise InvalidRecord("targets: must not be negative")
        await self._enter()
        pool = self.pools.get(template)
        if pool is None:
            return False
        kept = {h: n for h, n in sorted(targets.items()) if n > 0}
        self.pools[template] = replace(pool, targets=kept)
        return True

    # -- what a checker reads (no transaction, no fault) ---------------------------------------------

    def counted_usage(self, tenant_id: str) -> Usage:
        t = self.tenants[tenant_id]
        return t.usage()

    def recorded_usage(self, tenant_id: str) -> Usage:
        live = [sb for sb in self.sandboxes.values() if sb.tenant_id == tenant_id and sb.state in LIVE_STATES]
        cpu_m = sum(rows.to_millicores(sb.cpus) for sb in live)
        return Usage(len(live), sum(sb.memory_mb for sb in live), rows.from_millicores(cpu_m))

    def dump(self) -> str:
        """The whole state, canonically, for a run's digest."""
        return json.dumps(
            {
                "hosts": {
                    h: [x.seq, x.reserved_mb, x.facts.memory_mb_admittable, x.state]
                    for h, x in self.hosts.items()
                },
                "res": sorted(
                    [r.id, r.host_id, r.memory_mb, r.owner, r.expires_at] for r in self.reservations.values()
                ),
                "sb": sorted(
                    [sb.id, sb.state.value, sb.host_id, sb.version, sb.epoch]
                    for sb in self.sandboxes.values()
                ),
            },
            sort_keys=True,
            default=str,
        )
