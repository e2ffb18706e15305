"""The fleet as this replica last read it: a cache of positive facts, at most ``view_ttl`` old.

A cached absence is not a death: before refusing, the create flow forces one fresh read. Claims this
replica made since the last read are kept in a local ledger and subtracted on top of the read's
reserved totals, so the next decision in this replica sees them before the next read does. A read
that began after a claim's reservation was committed includes it, and retires the claim; a claim whose
reservation is still being written is never retired by a read.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from corral.control.ports import HostReader
from corral.core import Clock, HostView, Ledger, Pending, Reservation
from corral.core.filters import PendingFn
from corral.store import HostRecord


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    hosts: tuple[HostView, ...]
    records: dict[str, HostRecord]
    read_at: float
    generation: int

    def address(self, host_id: str) -> str:
        """Where the host's agent listens, as its last heartbeat said ("" for in-process agents)."""
        rec = self.records.get(host_id)
        return rec.address if rec is not None else ""


class Claim:
    """This replica's own note of capacity it is taking on a host, until a read of the store shows it."""

    __slots__ = ("_res", "committed_at")

    def __init__(self, res: Reservation) -> None:
        self._res = res
        # None while the reservation is being written: no read may retire the claim before then.
        self.committed_at: float | None = None

    @property
    def host_id(self) -> str:
        return self._res.host_id

    @property
    def active(self) -> bool:
        return self._res.active

    def release(self) -> None:
        self._res.release()


class ViewCache:
    def __init__(self, store: HostReader, clock: Clock, ttl_s: float, ledger_ttl_s: float) -> None:
        self._store = store
        self._clock = clock
        self._ttl_s = ttl_s
        self._snapshot: FleetSnapshot | None = None
        self._invalid = False
        self._lock = asyncio.Lock()
        self._generation = 0
        # Local, short-lived claims this replica made since its last read, with when each was made.
        self.recent = Ledger(clock, ttl_s=max(ledger_ttl_s, 2 * ttl_s, 0.1))
        self._claims: list[Claim] = []

    async def get(self, *, fresh: bool = False) -> FleetSnapshot:
        """The cached view, or a new read when it is too old; ``fresh``: a read that began after this
        call did (one read serves every caller that asked while it was waiting its turn)."""
        if not fresh and self._usable():
            assert self._snapshot is not None
            return self._snapshot
        asked = self._generation
        async with self._lock:
            snap = self._snapshot
            if snap is not None and (snap.generation > asked if fresh else self._usable()):
                return snap  # another coroutine read it while we waited
            return await self._read()

    def _usable(self) -> bool:
        snap = self._snapshot
        return not self._invalid and snap is not None and self._clock.now() - snap.read_at <= self._ttl_s

    async def _read(self) -> FleetSnapshot:
        started = self._clock.now()
        self._generation += 1  # numbered as it starts: "a read that began after I asked"
        generation = self._generation
        records = await self._store.list_hosts()
        # Claims made before this read began are in the store's totals now; later ones may not be.
        kept = []
        for claim in self._claims:
            if claim.committed_at is not None and claim.committed_at < started:
                claim.release()
            elif claim.active:
                kept.append(claim)
        self._claims = kept
        snap = FleetSnapshot(
            hosts=tuple(r.view() for r in records),
            records={r.id: r for r in records},
            read_at=started,
            generation=generation,
        )
        self._snapshot = snap
        self._invalid = False
        return snap

    @property
    def last(self) -> FleetSnapshot | None:
        """The last read, however old (for routing while the store is unreachable)."""
        return self._snapshot

    def invalidate(self) -> None:
        self._invalid = True

    def pending_fn(self, snap: FleetSnapshot) -> PendingFn:
        """Pending per host: the store's reserved totals at read time plus this replica's claims since.
        For one decision: each host's figure is worked out once however many filters and scores ask
        (no claim can change between them: a decision never awaits)."""
        records = snap.records
        recent = self.recent
        known: dict[str, Pending] = {}

        def pending(host_id: str) -> Pending:
            got = known.get(host_id)
            if got is not None:
                return got
            rec = records.get(host_id)
            mine = recent.pending(host_id)
            got = (
                mine
                if rec is None
                else Pending(rec.reserved_mb + mine.memory_mb, rec.reserved_cpu + mine.cpu)
            )
            known[host_id] = got
            return got

        return pending

    def claim(self, host_id: str, memory_mb: int, cpu: float) -> Claim:
        """Note capacity this replica is about to reserve, before the store has it. Call
        ``committed`` once the store's reservation exists, ``release`` if it does not (or ended)."""
        claim = Claim(self.recent.reserve(host_id, memory_mb, cpu))
        self._claims.append(claim)
        return claim

    def committed(self, claim: Claim) -> None:
        claim.committed_at = self._clock.now()
