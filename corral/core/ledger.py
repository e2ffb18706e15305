"""In-memory reservation ledger: capacity a decider has promised but no heartbeat shows yet.

Every reservation ends exactly once: released (confirmed or cancelled), expired against the injected
clock, or dropped with its owner (the replica that held it). Pending totals per host are kept
incrementally and expiry uses a heap, so ``pending`` costs O(1) plus whatever has just expired.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from corral.core.clock import Clock
from corral.core.types import NO_PENDING, Pending


@dataclass(slots=True, eq=False, repr=False)
class Reservation:
    """A handle on one claim. ``release()`` acts once; every later call (or expiry) is a no-op."""

    # Compared and hashed by identity: the ledger keeps each handle once, and two claims alike in every
    # field are still two claims.
    _ledger: Ledger
    id: int
    host_id: str
    memory_mb: int
    cpu: float
    owner: str
    expires_at: float

    @property
    def active(self) -> bool:
        return self._ledger._is_active(self)

    def release(self) -> bool:
        """End the claim. True if this call ended it, False if it had already ended."""
        return self._ledger._end(self)

    def __repr__(self) -> str:
        return f"Reservation({self.id}, host={self.host_id!r}, mb={self.memory_mb}, owner={self.owner!r})"


@dataclass(slots=True)
class _Totals:
    memory_mb: int = 0
    cpu: float = 0.0
    count: int = 0


class Ledger:
    def __init__(self, clock: Clock, ttl_s: float = 60.0) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self._clock = clock
        self.ttl_s = ttl_s
        self._live: dict[int, Reservation] = {}
        self._by_host: dict[str, _Totals] = {}
        self._by_owner: dict[str, set[int]] = {}
        self._expiry: list[tuple[float, int]] = []
        self._ids = itertools.count(1)
        self.expired_total = 0

    # -- claims -------------------------------------------------------------------------------

    def reserve(
        self, host_id: str, memory_mb: int, cpu: float = 0.0, owner: str = "local", ttl_s: float | None = None
    ) -> Reservation:
        if memory_mb < 0 or cpu < 0:
            raise ValueError("a reservation cannot be negative")
        self.expire()
        expires_at = self._clock.now() + (self.ttl_s if ttl_s is None else ttl_s)
        res = Reservation(self, next(self._ids), host_id, memory_mb, cpu, owner, expires_at)
        self._live[res.id] = res
        totals = self._by_host.get(host_id)
        if totals is None:
            totals = self._by_host[host_id] = _Totals()
        totals.memory_mb += memory_mb
        totals.cpu += cpu
        totals.count += 1
        self._by_owner.setdefault(owner, set()).add(res.id)
        heapq.heappush(self._expiry, (expires_at, res.id))
        return res

    def release(self, reservation_id: int) -> bool:
        res = self._live.get(reservation_id)
        return res is not None and self._end(res)

    def drop_owner(self, owner: str) -> int:
        """End every claim of ``owner`` (a replica that died). Returns how many ended."""
        ids = self._by_owner.get(owner)
        if not ids:
            return 0
        return sum(self._end(self._live[i]) for i in list(ids))

    def expire(self) -> int:
        """End every claim whose time has come. Called by every read, so nothing outlives its TTL."""
        now = self._clock.now()
        ended = 0
        heap = self._expiry
        while heap and heap[0][0] <= now:
            _, rid = heapq.heappop(heap)
            res = self._live.get(rid)
            if res is not None and self._end(res):
                ended += 1
        self.expired_total += ended
        return ended

    # -- reads --------------------------------------------------------------------------------

    def pending(self, host_id: str) -> Pending:
        if self._expiry and self._expiry[0][0] <= self._clock.now():
            self.expire()
        t = self._by_host.get(host_id)
        if t is None:
            return NO_PENDING
        return Pending(t.memory_mb, t.cpu)

    def outstanding(self) -> dict[str, Pending]:
        """Pending per host, for every host that has any."""
        self.expire()
        return {h: Pending(t.memory_mb, t.cpu) for h, t in self._by_host.items()}

    def outstanding_mb(self) -> int:
        self.expire()
        return sum(t.memory_mb for t in self._by_host.values())

    def owned_by(self, owner: str) -> list[Reservation]:
        return [self._live[i] for i in self._by_owner.get(owner, ())]

    def next_expiry(self) -> float | None:
        """When the earliest live claim expires (for an honest Retry-After)."""
        self.expire()
        heap = self._expiry
        while heap and heap[0][1] not in self._live:
            heapq.heappop(heap)  # lazily drop entries of claims that already ended
        return heap[0][0] if heap else None

    def __len__(self) -> int:
        return len(self._live)

    def __iter__(self) -> Iterator[Reservation]:
        return iter(list(self._live.values()))

    # -- internals ----------------------------------------------------------------------------

    def _is_active(self, res: Reservation) -> bool:
        return self._live.get(res.id) is res and res.expires_at > self._clock.now()

    def _end(self, res: Reservation) -> bool:
        if self._live.pop(res.id, None) is None:
            return False
        totals = self._by_host[res.host_id]
        totals.memory_mb -= res.memory_mb
        totals.cpu -= res.cpu
        totals.count -= 1
        if totals.count == 0:
            del self._by_host[res.host_id]  # drops float residue with it: idle means exactly zero
        owned = self._by_owner[res.owner]
        owned.discard(res.id)
        if not owned:
            del self._by_owner[res.owner]
        return True
