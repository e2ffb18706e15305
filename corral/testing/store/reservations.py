"""Reservations in the store model: taken against a host's counters by the core's fit rule, spread
score and tie-break, as the SQL stores render them; each ends exactly once."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace

from corral.core.admission import host_fits
from corral.core.fit import TAKES_STATE, tie_rank
from corral.core.types import HOST_FACTS, CreateRequest, HostView, Pending
from corral.store import rows
from corral.store.contract import Reservations
from corral.store.records import (
    ReservationRecord,
    ReserveItem,
    check_reservation,
    claim_record,
)
from corral.testing.store.base import ModelBase, _Host


def _ask(memory_mb: int, cpu_m: int, image: str | None = None) -> CreateRequest:
    """A claim as the core's rule reads it: stateful, so its charge is its memory in any admission
    mode (the store charges a claim what it says), and its CPU in whole millicores as stored."""
    return CreateRequest(memory_mb=memory_mb, cpu=rows.from_millicores(cpu_m), stateful=True, image=image)


class ReservationsModel(ModelBase, Reservations):
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

    def _claim(self, item: ReserveItem, owner: str, ttl_s: float) -> ReservationRecord:
        now = self._now()
        return claim_record(self._id(), item, owner, ttl_s, now)

    async def _reserve_checked(self, item: ReserveItem, owner: str, ttl_s: float) -> ReservationRecord | None:
        await self._enter()
        r = self._claim(item, owner, ttl_s)
        h = self.hosts.get(item.host_id)
        if h is None:
            return None
        ask = _ask(item.memory_mb, rows.to_millicores(item.cpu))
        if not self._room(h, ask):
            # Expired reservations are folded only when nothing fits without them.
            self._fold_expired([item.host_id], r.created_at)
            if not self._room(h, ask):
                return None
        self._take(r)
        return r

    async def _reserve_best_checked(
        self, candidates: Sequence[str], item: ReserveItem, owner: str, ttl_s: float, image: str | None
    ) -> ReservationRecord | None:
        await self._enter()
        template = self._claim(item, owner, ttl_s)
        ask = _ask(item.memory_mb, rows.to_millicores(item.cpu), image)
        salt = item.sandbox_id or template.id
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
            check_reservation(it.memory_mb, it.cpu, ttl_s)
        await self._enter()
        records = [self._claim(i, owner, ttl_s) for i in items]
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
