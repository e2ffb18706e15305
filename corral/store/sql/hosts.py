"""Hosts: registration, heartbeats (the host's facts and what it runs), drain, removal."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from corral.core.types import AdmissionMode, HostState
from corral.store import listings, rows
from corral.store.errors import (
    InvalidRecord,
    RecordNotFound,
)
from corral.store.records import (
    HeartbeatResult,
    HostRecord,
    HostReport,
    ListingChange,
)
from corral.store.sql.base import (
    SqlBase,
    Tx,
)


class HostsSql(SqlBase):
    async def register_host(self, host_id: str, *, address: str = "", role: str = "worker") -> HostRecord:
        if not host_id:
            raise InvalidRecord("host_id: must not be empty")
        now = self._now()

        async def run(tx: Tx) -> HostRecord:
            await tx.execute(
                """INSERT INTO hosts (id, address, role, registered_at) VALUES (:id, :address, :role, :now)
                   ON CONFLICT (id) DO UPDATE SET
                     address = CASE WHEN excluded.address <> '' THEN excluded.address ELSE hosts.address END,
                     role = excluded.role""",
                {"id": host_id, "address": address, "role": role, "now": now},
            )
            host = await self._host(tx, host_id, now)
            assert host is not None
            return host

        return await self._write(run)

    async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None:
        if not counts:
            return

        async def run(tx: Tx) -> None:
            for sandbox_id, count in sorted(counts.items()):
                await tx.execute(
                    "UPDATE sandboxes SET oom_kills = :n WHERE id = :id AND host_id = :h AND oom_kills < :n",
                    {"n": count, "id": sandbox_id, "h": host_id},
                )

        await self._write(run)

    async def upsert_heartbeat(self, hb: HostReport) -> HeartbeatResult:
        if not hb.host_id:
            raise InvalidRecord("host_id: must not be empty")
        now = self._now()
        f = hb.facts
        params = {
            "id": hb.host_id,
            "address": hb.address,
            "now": now,
            "seq": hb.seq,
            "cpu_total": f.cpu_total,
            "cpu_used": f.cpu_used,
            "mt": f.memory_mb_total,
            "mu": f.memory_mb_used,
            "ma": f.memory_mb_admittable,
            "mode": AdmissionMode(f.memory_admission).value,
            "templates": rows.json_list(f.templates),
            "runtime": f.runtime,
            "gpu": f.gpu,
            "role": f.role,
            "sr": bool(f.stream_restore),
            "warm": rows.warm_to_json(hb.warm),
            "images": rows.json_list(f.images),
        }

        async def run(tx: Tx) -> HeartbeatResult:
            # The host's row lock first (the lock order), then its listing rows and the reservations
            # the heartbeat confirms, then the row itself in one write: at a fleet's size heartbeats
            # are the largest stream of writes, and each rewrites its host's row once. A delayed
            # heartbeat (seq not newer) writes nothing; ``state`` is never written: a heartbeat never
            # undrains a host.
            held = await self._listing_stamp(tx, hb)
            if held is None:
                host = await self._host(tx, hb.host_id, now)
                assert host is not None
                return HeartbeatResult(host, False, 0, frozenset())
            stamp = await listings.apply(tx, hb, held, now)
            confirmed, mb, cpu_m = await listings.confirm(tx, hb)
            await tx.execute(
                """UPDATE hosts SET
                     address = CASE WHEN :address <> '' THEN :address ELSE address END,
                     heartbeat_at = :now, seq = :seq, cpu_total = :cpu_total, cpu_used = :cpu_used,
                     memory_mb_total = :mt, memory_mb_used = :mu, memory_mb_admittable = :ma,
                     memory_admission = :mode, templates = :templates, runtime = :runtime, gpu = :gpu,
                     role = :role, stream_restore = :sr, warm = :warm, images = :images,
                     listed_seq = :lseq, listed_digest = :ldigest, listed_at = :lat, listed_count = :lcount,
                     reserved_mb = reserved_mb - :rmb, reserved_cpu_m = reserved_cpu_m - :rcpu
                   WHERE id = :id""",
                {
                    **params,
                    "lseq": stamp.seq,
                    "ldigest": stamp.digest,
                    "lat": stamp.at,
                    "lcount": stamp.count,
                    "rmb": mb,
                    "rcpu": cpu_m,
                },
            )
            fenced = await listings.fences(tx, hb.host_id) if stamp.seq == hb.seq else frozenset()
            host = await self._host(tx, hb.host_id, now)
            assert host is not None
            return HeartbeatResult(host, True, confirmed, fenced)

        return await self._write(run)

    async def _listing_stamp(self, tx: Tx, hb: HostReport) -> listings.Stamp | None:
        """Lock the host's row (registering a host heard of for the first time) and read its listing
        columns; None if the row holds a heartbeat as new as ``hb`` already."""
        sql = f"SELECT seq, listed_seq, listed_digest, listed_at, listed_count FROM hosts WHERE id = :id{self.for_update}"
        row = await tx.fetchone(sql, {"id": hb.host_id})
        if row is None:
            await tx.execute(
                "INSERT INTO hosts (id, address, role, registered_at) VALUES (:id, :address, :role, :now) "
                "ON CONFLICT (id) DO NOTHING",
                {"id": hb.host_id, "address": hb.address, "role": hb.facts.role, "now": self._now()},
            )
            row = await tx.fetchone(sql, {"id": hb.host_id})
            assert row is not None
        if int(row[0]) >= hb.seq:
            return None
        return listings.Stamp(
            None if row[1] is None else int(row[1]), int(row[2]), float(row[3]), int(row[4])
        )

    async def listing_changes(self, since: float) -> list[ListingChange]:
        return await self._read(lambda tx: listings.changes(tx, since))

    async def listing_disputes(self, since: float) -> list[ListingChange]:
        return await self._read(lambda tx: listings.disputes(tx, since))

    async def listed(self, host_id: str, sandbox_ids: Collection[str]) -> dict[str, int]:
        return await self._read(lambda tx: listings.held_entries(tx, host_id, sandbox_ids))

    async def listed_hosts(self, sandbox_ids: Collection[str]) -> dict[str, str]:
        return await self._read(lambda tx: listings.hosts_of(tx, sandbox_ids))

    async def prune_listings(self, before: float) -> int:
        return await self._write(
            lambda tx: tx.execute(
                "DELETE FROM listed_sandboxes WHERE present = :no AND changed_at < :before",
                {"no": False, "before": before},
            )
        )

    async def committed_mb(self) -> int:
        row = await self._read(lambda tx: tx.fetchone("SELECT coalesce(sum(live_memory_mb), 0) FROM tenants"))
        return int(row[0]) if row is not None else 0

    async def _set_host_state(self, host_id: str, state: HostState) -> HostRecord:
        now = self._now()

        async def run(tx: Tx) -> HostRecord:
            n = await tx.execute(
                "UPDATE hosts SET state = :s WHERE id = :id", {"s": state.value, "id": host_id}
            )
            if n == 0:
                raise RecordNotFound(f"host {host_id!r}")
            host = await self._host(tx, host_id, now)
            assert host is not None
            return host

        return await self._write(run)

    async def drain(self, host_id: str) -> HostRecord:
        return await self._set_host_state(host_id, HostState.DRAINING)

    async def undrain(self, host_id: str) -> HostRecord:
        return await self._set_host_state(host_id, HostState.READY)

    async def delete_host(self, host_id: str) -> bool:
        async def run(tx: Tx) -> bool:
            await self._end_where(tx, "host_id = :h", {"h": host_id})
            await tx.execute("DELETE FROM listed_sandboxes WHERE host_id = :id", {"id": host_id})
            return await tx.execute("DELETE FROM hosts WHERE id = :id", {"id": host_id}) > 0

        return await self._write(run)

    async def get_host(self, host_id: str) -> HostRecord | None:
        now = self._now()
        return await self._read(lambda tx: self._host(tx, host_id, now))

    async def list_hosts(self) -> list[HostRecord]:
        now = self._now()
        sql = rows.HOSTS_SELECT.format(scope="") + " ORDER BY h.id"

        async def run(tx: Tx) -> list[HostRecord]:
            return [rows.host_from_row(r) for r in await tx.fetchall(sql, {"now": now})]

        return await self._read(run)
