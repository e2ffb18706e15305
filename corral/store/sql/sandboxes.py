"""Sandbox records: create (quota, name, idempotency), state changes, expiry, listing, deletion."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from corral.store import listings, rows
from corral.store.errors import (
    IdempotencyMismatch,
    NameConflict,
    RecordNotFound,
    StateConflict,
)
from corral.store.records import (
    LIVE_STATES,
    CreateOutcome,
    Page,
    PageQuery,
    SandboxRecord,
    SandboxState,
    SandboxSummary,
    StateChange,
    Usage,
    _Unset,
    check_lifecycle,
    check_network,
    check_quota,
    from_millicores,
    metadata_dict,
    to_millicores,
)
from corral.store.rows import in_list
from corral.store.sql.base import (
    NOT_RUNNING,
    UNINDEXED_STATE,
    SqlBase,
    Tx,
    _json,
)


class SandboxesSql(SqlBase):
    async def _count_usage(self, tx: Tx, tenant_id: str, sandboxes: int, memory_mb: int, cpu_m: int) -> None:
        if sandboxes or memory_mb or cpu_m:
            await tx.execute(
                "UPDATE tenants SET live_sandboxes = live_sandboxes + :n, live_memory_mb = live_memory_mb + :mb, "
                "live_cpu_m = live_cpu_m + :cpu WHERE id = :t",
                {"t": tenant_id, "n": sandboxes, "mb": memory_mb, "cpu": cpu_m},
            )

    _COUNT_IF_ROOM = (
        "UPDATE tenants SET live_sandboxes = live_sandboxes + 1, live_memory_mb = live_memory_mb + :mb, "
        "live_cpu_m = live_cpu_m + :cpu "
        "WHERE id = :t AND live_sandboxes + 1 <= max_sandboxes AND live_memory_mb + :mb <= max_memory_mb "
        "AND live_cpu_m + :cpu <= max_cpu_m RETURNING id"
    )

    async def _check_name(self, tx: Tx, rec: SandboxRecord) -> None:
        if rec.name is not None:
            taken = await tx.fetchone(
                "SELECT id FROM sandboxes WHERE tenant_id = :t AND name = :n AND state <> 'deleted'",
                {"t": rec.tenant_id, "n": rec.name},
            )
            if taken is not None:
                raise NameConflict(f"name {rec.name!r} is taken by sandbox {taken[0]}")

    async def _create_checks(
        self,
        tx: Tx,
        rec: SandboxRecord,
        idempotency_key: str | None,
        request_hash: str | None,
        lock: bool,
    ) -> CreateOutcome | None:
        """Idempotency, name and quota, in the order ``create_sandbox`` applies them: a replay's
        outcome, or None when the record may be inserted."""
        # The tenant's row lock serialises its creates: the quota count below cannot be raced.
        tenant = await tx.fetchone(
            f"SELECT {rows.TENANT_COLS}, live_sandboxes, live_memory_mb, live_cpu_m FROM tenants "
            f"WHERE id = :t{self.for_update if lock else ''}",
            {"t": rec.tenant_id},
        )
        if tenant is None:
            raise RecordNotFound(f"tenant {rec.tenant_id!r}")
        if idempotency_key is not None:
            seen = await tx.fetchone(
                "SELECT request_hash, sandbox_id, record FROM idempotency_keys WHERE tenant_id = :t AND key = :k",
                {"t": rec.tenant_id, "k": idempotency_key},
            )
            if seen is not None:
                if seen[0] is not None and request_hash is not None and seen[0] != request_hash:
                    raise IdempotencyMismatch(
                        f"idempotency key {idempotency_key!r} was first used with a different request"
                    )
                current = await self._sandbox(tx, seen[1])
                return CreateOutcome(current or rows.sandbox_from_json(seen[2]), replayed=True)
        await self._check_name(tx, rec)
        if rec.state in LIVE_STATES:
            used = Usage(int(tenant[-3]), int(tenant[-2]), from_millicores(int(tenant[-1])))
            check_quota(rows.tenant_from_row(tenant), used, rec.memory_mb, rec.cpus)
        return None

    async def _create_checked(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome:
        now = self._now()
        rec = SandboxRecord(
            id=record.id,
            tenant_id=record.tenant_id,
            template=record.template,
            memory_mb=record.memory_mb,
            cpus=record.cpus,
            state=SandboxState(record.state),
            name=record.name,
            host_id=record.host_id,
            stateful=record.stateful,
            metadata=metadata_dict(record.metadata),
            created_at=now,
            updated_at=now,
            expires_at=record.expires_at,
            reservation_id=record.reservation_id,
            version=1,
            warm=record.warm,
            failover=record.failover,
            epoch=record.epoch,
            sealed_spec=record.sealed_spec,
            owner=record.owner,
            image=record.image,
            disk_mb=record.disk_mb,
            network=record.network,
            lifecycle=record.lifecycle,
            paused=record.paused,
        )

        counted = rec.state in LIVE_STATES

        async def run(tx: Tx) -> CreateOutcome:
            # Without an Idempotency-Key there is nothing to replay: the quota is checked and counted
            # by one conditional UPDATE (the tenant's row lock serialises its creates). When it refuses,
            # the full checks below name the limit that was hit.
            fast = (
                idempotency_key is None
                and counted
                and await tx.fetchone(
                    self._COUNT_IF_ROOM,
                    {"t": rec.tenant_id, "mb": rec.memory_mb, "cpu": to_millicores(rec.cpus)},
                )
                is not None
            )
            if fast:
                await self._check_name(tx, rec)
            else:
                replay = await self._create_checks(tx, rec, idempotency_key, request_hash, lock=True)
                if replay is not None:
                    return replay
                if counted:
                    await self._count_usage(tx, rec.tenant_id, 1, rec.memory_mb, to_millicores(rec.cpus))
            await tx.execute(
                f"INSERT INTO sandboxes ({rows.SANDBOX_COLS}, spec) VALUES (:id, :t, :name, :template, :host, "
                ":state, :mb, :cpus, :stateful, :meta, :now, :now, :exp, :rid, 1, 0, :warm, :fo, :ep, NULL, NULL, "
                ":owner, :image, :disk, :net, :life, :paused, :spec)",
                {
                    "id": rec.id,
                    "t": rec.tenant_id,
                    "name": rec.name,
                    "template": rec.template,
                    "host": rec.host_id,
                    "state": rec.state.value,
                    "mb": rec.memory_mb,
                    "cpus": rec.cpus,
                    "stateful": bool(rec.stateful),
                    "meta": _json(rec.metadata),
                    "now": now,
                    "exp": rec.expires_at,
                    "rid": rec.reservation_id,
                    "warm": bool(rec.warm),
                    "fo": rec.failover,
                    "ep": rec.epoch,
                    "spec": rec.sealed_spec,
                    "owner": rec.owner,
                    "image": rec.image,
                    "disk": rec.disk_mb,
                    "net": rec.network,
                    "life": rec.lifecycle,
                    "paused": rec.paused,
                },
            )
            if idempotency_key is not None:
                await tx.execute(
                    "INSERT INTO idempotency_keys (tenant_id, key, request_hash, sandbox_id, record, created_at) "
                    "VALUES (:t, :k, :h, :id, :rec, :now)",
                    {
                        "t": rec.tenant_id,
                        "k": idempotency_key,
                        "h": request_hash,
                        "id": rec.id,
                        "rec": rows.sandbox_to_json(rec),
                        "now": now,
                    },
                )
            return CreateOutcome(rec, replayed=False)

        return await self._write_unique(run, f"sandbox {rec.id!r} (or its name) already exists")

    async def _check_create_checked(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome | None:
        return await self._read(
            lambda tx: self._create_checks(tx, record, idempotency_key, request_hash, lock=False)
        )

    async def purge_idempotency_keys(self, older_than: float) -> int:
        async def run(tx: Tx) -> int:
            return await tx.execute("DELETE FROM idempotency_keys WHERE created_at < :t", {"t": older_than})

        return await self._write(run)

    async def _set_state_checked(self, sandbox_id: str, change: StateChange) -> SandboxRecord:
        new_state, expected = change.state, change.expected
        now = self._now()
        sets = ["state = :state", "updated_at = :now", "version = version + 1"]
        params: dict[str, Any] = {"id": sandbox_id, "state": new_state.value, "now": now}
        if not isinstance(change.host_id, _Unset):
            sets.append("host_id = :host")
            params["host"] = change.host_id
        if not isinstance(change.reservation_id, _Unset):
            sets.append("reservation_id = :rid")
            params["rid"] = change.reservation_id
        if not isinstance(change.placement, _Unset):
            sets.append("placement = :pl")
            params["pl"] = change.placement
        where = ["id = :id"]
        if expected is not None:
            clause, sp = in_list("x", sorted(s.value for s in expected))
            where.append(f"state IN {clause}")
            params.update(sp)
        if change.expect_version is not None:
            where.append("version = :v")
            params["v"] = change.expect_version
        # One conditional UPDATE: PostgreSQL re-checks the WHERE against the newest row version, so of
        # two concurrent compare-and-sets on the same state exactly one passes.
        sql = f"UPDATE sandboxes SET {', '.join(sets)} WHERE {' AND '.join(where)} RETURNING {rows.SANDBOX_COLS}"

        # Usage counters move only when a sandbox crosses between live and not-live states; when every
        # state it may be in now is on the same side as the new one, the one UPDATE is the whole story.
        same_side = expected is not None and all(
            (st in LIVE_STATES) == (new_state in LIVE_STATES) for st in expected
        )

        async def run(tx: Tx) -> SandboxRecord:
            before = None
            if not same_side:
                before = await tx.fetchone(
                    f"SELECT state FROM sandboxes WHERE id = :id{self.for_update}", {"id": sandbox_id}
                )
            row = await tx.fetchone(sql, params)
            if row is not None:
                rec = rows.sandbox_from_row(row)
                if before is not None:
                    delta = int(new_state in LIVE_STATES) - int(SandboxState(before[0]) in LIVE_STATES)
                    await self._count_usage(
                        tx, rec.tenant_id, delta, delta * rec.memory_mb, delta * to_millicores(rec.cpus)
                    )
                return rec
            current = await self._sandbox(tx, sandbox_id)
            if current is None:
                raise RecordNotFound(f"sandbox {sandbox_id!r}")
            raise StateConflict(sandbox_id, current.state, current.version)

        return await self._write_unique(run, f"sandbox {sandbox_id!r}: its name is taken by a live sandbox")

    async def set_sandbox_expiry(self, sandbox_id: str, expires_at: float | None) -> SandboxRecord:
        return await self._set_column(sandbox_id, "expires_at", expires_at)

    async def set_sandbox_network(self, sandbox_id: str, network: str | None) -> SandboxRecord:
        check_network(network)
        return await self._set_column(sandbox_id, "network", network)

    async def set_sandbox_paused(
        self, sandbox_id: str, paused: str | None, expires_at: float | None
    ) -> SandboxRecord:
        check_lifecycle(None, paused)
        return await self._set_columns(sandbox_id, {"paused": paused, "expires_at": expires_at})

    async def _set_column(self, sandbox_id: str, column: str, value: object) -> SandboxRecord:
        return await self._set_columns(sandbox_id, {column: value})

    async def _set_columns(self, sandbox_id: str, values: dict[str, object]) -> SandboxRecord:
        """Columns of one record set (the names are this module's literals, never input)."""
        now = self._now()
        sets = ", ".join(f"{column} = :v_{column}" for column in values)

        async def run(tx: Tx) -> SandboxRecord:
            row = await tx.fetchone(
                f"UPDATE sandboxes SET {sets}, updated_at = :now, version = version + 1 "
                f"WHERE id = :id RETURNING {rows.SANDBOX_COLS}",
                {"id": sandbox_id, "now": now, **{f"v_{c}": v for c, v in values.items()}},
            )
            if row is None:
                raise RecordNotFound(f"sandbox {sandbox_id!r}")
            return rows.sandbox_from_row(row)

        return await self._write(run)

    async def host_activity(self, since: float) -> dict[str, tuple[int, int]]:
        live, params = in_list("l", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> dict[str, tuple[int, int]]:
            placed = await tx.fetchall(
                "SELECT host_id, count(*) FROM sandboxes WHERE created_at >= :t AND host_id IS NOT NULL "
                "GROUP BY host_id",
                {"t": since},
            )
            committed = await tx.fetchall(
                f"SELECT host_id, CAST(sum(memory_mb) AS BIGINT) FROM sandboxes WHERE state IN {live} "
                "AND host_id IS NOT NULL GROUP BY host_id",
                params,
            )
            out: dict[str, tuple[int, int]] = {}
            for h, n in placed:
                out[h] = (int(n), 0)
            for h, mb in committed:
                out[h] = (out.get(h, (0, 0))[0], int(mb or 0))
            return out

        return await self._read(run)

    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None:
        async def run(tx: Tx) -> str | None:
            row = await tx.fetchone(
                "SELECT tenant_id, placement FROM sandboxes WHERE id = :id", {"id": sandbox_id}
            )
            if row is None or (tenant_id is not None and row[0] != tenant_id):
                raise RecordNotFound(f"sandbox {sandbox_id!r}")
            return None if row[1] is None else str(row[1])

        return await self._read(run)

    async def get_placements(self, sandbox_ids: Collection[str]) -> dict[str, str | None]:
        async def run(tx: Tx) -> dict[str, str | None]:
            out: dict[str, str | None] = {}
            for part in listings.chunks(sandbox_ids):
                clause, params = in_list("g", part)
                for sid, placement in await tx.fetchall(
                    f"SELECT id, placement FROM sandboxes WHERE id IN {clause}", params
                ):
                    out[str(sid)] = None if placement is None else str(placement)
            return out

        return await self._read(run)

    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        async def run(tx: Tx) -> SandboxRecord | None:
            rec = await self._sandbox(tx, sandbox_id)
            if rec is None or (tenant_id is not None and rec.tenant_id != tenant_id):
                return None
            return rec

        return await self._read(run)

    async def get_sandboxes(self, sandbox_ids: Collection[str]) -> dict[str, SandboxRecord]:
        async def run(tx: Tx) -> dict[str, SandboxRecord]:
            out: dict[str, SandboxRecord] = {}
            for part in listings.chunks(sandbox_ids):
                clause, params = in_list("g", part)
                for r in await tx.fetchall(
                    f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE id IN {clause}", params
                ):
                    rec = rows.sandbox_from_row(r)
                    out[rec.id] = rec
            return out

        return await self._read(run)

    async def _list_checked(self, query: PageQuery) -> Page:
        tenant_id, host_id, states, limit = query.tenant_id, query.host_id, query.states, query.limit
        where: list[str] = []
        params: dict[str, Any] = {"lim": limit + 1}
        if tenant_id is not None:
            where.append("tenant_id = :t")
            params["t"] = tenant_id
        if host_id is not None:
            where.append("host_id = :h")
            params["h"] = host_id
        if states is not None:
            clause, sp = in_list("s", sorted(s.value for s in states))
            # A tenant's or a host's sandboxes are found by their own index, never by reading every
            # sandbox in a state (most are running).
            column = "state" if tenant_id is None and host_id is None else UNINDEXED_STATE
            where.append(f"{column} IN {clause}")
            params.update(sp)
            if column == "state" and SandboxState.RUNNING not in states:
                where.append(NOT_RUNNING)  # the state index's own condition: the planner may use it
        if query.after is not None:
            beyond = "<" if query.newest_first else ">"
            where.append(f"(created_at {beyond} :ca OR (created_at = :ca AND id {beyond} :cid))")
            params.update(ca=query.after[0], cid=query.after[1])
        order = "created_at DESC, id DESC" if query.newest_first else "created_at, id"
        sql = (
            f"SELECT {rows.SANDBOX_COLS} FROM sandboxes"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY {order} LIMIT :lim"
        )

        async def run(tx: Tx) -> Page:
            return rows.page_of([rows.sandbox_from_row(r) for r in await tx.fetchall(sql, params)], limit)

        return await self._read(run)

    async def _summaries_checked(
        self, tenant_id: str | None, after: tuple[float, str] | None, limit: int
    ) -> list[SandboxSummary]:
        # The state test is written so that no state index is chosen: the order's index is the read.
        where = [f"{UNINDEXED_STATE} <> :deleted"]
        params: dict[str, Any] = {"deleted": SandboxState.DELETED.value, "lim": limit}
        if tenant_id is not None:
            where.append("tenant_id = :t")
            params["t"] = tenant_id
        if after is not None:
            where.append("(created_at > :ca OR (created_at = :ca AND id > :cid))")
            params.update(ca=after[0], cid=after[1])
        sql = (
            f"SELECT {rows.SUMMARY_COLS} FROM sandboxes WHERE {' AND '.join(where)} "
            "ORDER BY created_at, id LIMIT :lim"
        )

        async def run(tx: Tx) -> list[SandboxSummary]:
            return [rows.summary_from_row(r) for r in await tx.fetchall(sql, params)]

        return await self._read(run)

    async def delete_sandbox(
        self, sandbox_id: str, *, forget_idempotency: bool = False, expect: SandboxState | None = None
    ) -> bool:
        where, params = "id = :id", {"id": sandbox_id}
        if expect is not None:
            where, params = f"{where} AND state = :st", {**params, "st": SandboxState(expect).value}

        async def run(tx: Tx) -> bool:
            gone = await tx.fetchone(
                f"DELETE FROM sandboxes WHERE {where} RETURNING tenant_id, state, memory_mb, cpus", params
            )
            if gone is not None:
                await tx.execute("DELETE FROM sandbox_domains WHERE sandbox_id = :id", {"id": sandbox_id})
            if forget_idempotency and (gone is not None or expect is None):
                await tx.execute("DELETE FROM idempotency_keys WHERE sandbox_id = :id", {"id": sandbox_id})
            if gone is None:
                return False
            if SandboxState(gone[1]) in LIVE_STATES:
                await self._count_usage(tx, str(gone[0]), -1, -int(gone[2]), -to_millicores(float(gone[3])))
            return True

        return await self._write(run)

    async def expired_sandboxes(self, now: float | None = None, *, limit: int = 100) -> list[SandboxRecord]:
        at = self._now() if now is None else now
        clause, params = in_list("s", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> list[SandboxRecord]:
            got = await tx.fetchall(
                f"SELECT {rows.SANDBOX_COLS} FROM sandboxes WHERE expires_at IS NOT NULL AND expires_at <= :now "
                f"AND {UNINDEXED_STATE} IN {clause} ORDER BY expires_at, id LIMIT :lim",
                {"now": at, "lim": limit, **params},
            )
            return [rows.sandbox_from_row(r) for r in got]

        return await self._read(run)
