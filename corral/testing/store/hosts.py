"""Hosts in the store model: registration, heartbeats and the listings they carry (applied as
:mod:`corral.store.listings` applies them, statement for statement), drain, OOM kills."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from corral.core.listing import digest_of, fold
from corral.core.types import HostState
from corral.store.errors import (
    InvalidRecord,
    RecordNotFound,
)
from corral.store.records import (
    HeartbeatResult,
    HostRecord,
    HostReport,
    Listing,
    ListingChange,
    SandboxState,
    disputed,
)
from corral.testing.store.base import ModelBase, _Entry, _Host


class HostsModel(ModelBase):
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

    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None:
        if not counts:
            return
        await self._enter()
        for sandbox_id, n in sorted(counts.items()):
            sb = self.sandboxes.get(sandbox_id)
            if sb is not None and sb.host_id == host_id and sb.oom_kills < n:
                self.sandboxes[sandbox_id] = replace(sb, oom_kills=n)  # not a state change: no version
