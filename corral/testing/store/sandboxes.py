"""Sandbox records in the store model: idempotency keys, name uniqueness and quotas in the SQL
stores' order, compare-and-set state changes, keyset pages, TTL expiry."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from corral.store import rows
from corral.store.contract import ClaimRecords, RecordReads, RecordStates
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
    _Unset,
    check_lifecycle,
    check_network,
    check_quota,
    metadata_dict,
)
from corral.testing.store.base import ModelBase


class SandboxesModel(ModelBase, ClaimRecords, RecordReads, RecordStates):
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

    async def _create_checked(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome:
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

    async def _check_create_checked(
        self, record: SandboxRecord, idempotency_key: str | None, request_hash: str | None
    ) -> CreateOutcome | None:
        await self._enter()
        return self._create_checks(record, idempotency_key, request_hash)

    async def purge_idempotency_keys(self, older_than: float) -> int:
        await self._enter()
        old = [k for k, v in self.idempotency.items() if v[3] < older_than]
        for k in old:
            del self.idempotency[k]
        return len(old)

    async def _set_state_checked(self, sandbox_id: str, change: StateChange) -> SandboxRecord:
        new_state, expected = change.state, change.expected
        await self._enter()
        sb = self._sandbox(sandbox_id)
        if (expected is not None and sb.state not in expected) or (
            change.expect_version is not None and sb.version != change.expect_version
        ):
            raise StateConflict(sandbox_id, sb.state, sb.version)
        if (
            sb.state is SandboxState.DELETED
            and new_state is not SandboxState.DELETED
            and self._name_taken(sb.tenant_id, sb.name, sb.id) is not None
        ):
            raise NameConflict(f"sandbox {sandbox_id!r}: its name is taken by a live sandbox")
        changes: dict[str, object] = {"state": new_state, "updated_at": self._now()}
        if not isinstance(change.host_id, _Unset):
            changes["host_id"] = change.host_id
        if not isinstance(change.reservation_id, _Unset):
            changes["reservation_id"] = change.reservation_id
        if not isinstance(change.placement, _Unset):
            self.placements[sandbox_id] = change.placement
        return self._put(sb, **changes)

    async def set_sandbox_network(self, sandbox_id: str, network: str | None) -> SandboxRecord:
        check_network(network)
        await self._enter()
        sb = self._sandbox(sandbox_id)
        return self._put(sb, network=network, updated_at=self._now())

    async def set_sandbox_paused(
        self, sandbox_id: str, paused: str | None, expires_at: float | None
    ) -> SandboxRecord:
        check_lifecycle(None, paused)
        await self._enter()
        sb = self._sandbox(sandbox_id)
        return self._put(sb, paused=paused, expires_at=expires_at, updated_at=self._now())

    async def get_placement(self, sandbox_id: str, *, tenant_id: str | None = None) -> str | None:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None or (tenant_id is not None and sb.tenant_id != tenant_id):
            raise RecordNotFound(f"sandbox {sandbox_id!r}")
        return self.placements.get(sandbox_id)

    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        await self._enter()
        sb = self.sandboxes.get(sandbox_id)
        if sb is None or (tenant_id is not None and sb.tenant_id != tenant_id):
            return None
        return sb

    async def get_placements(self, sandbox_ids: Collection[str]) -> dict[str, str | None]:
        await self._enter()
        return {sid: self.placements.get(sid) for sid in sandbox_ids if sid in self.sandboxes}

    async def get_sandboxes(self, sandbox_ids: Collection[str]) -> dict[str, SandboxRecord]:
        await self._enter()
        return {sid: self.sandboxes[sid] for sid in sandbox_ids if sid in self.sandboxes}

    async def _list_checked(self, query: PageQuery) -> Page:
        tenant_id, host_id, states, after = query.tenant_id, query.host_id, query.states, query.after
        newest_first = query.newest_first
        await self._enter()
        got = sorted(
            (
                sb
                for sb in self.sandboxes.values()
                if (tenant_id is None or sb.tenant_id == tenant_id)
                and (host_id is None or sb.host_id == host_id)
                and (states is None or sb.state in states)
                and (
                    after is None
                    or ((sb.created_at, sb.id) < after if newest_first else (sb.created_at, sb.id) > after)
                )
            ),
            key=lambda sb: (sb.created_at, sb.id),
            reverse=newest_first,
        )
        return rows.page_of(got, query.limit)

    async def _summaries_checked(
        self, tenant_id: str | None, after: tuple[float, str] | None, limit: int
    ) -> list[SandboxSummary]:
        await self._enter()
        got = sorted(
            (
                sb
                for sb in self.sandboxes.values()
                if (tenant_id is None or sb.tenant_id == tenant_id)
                and sb.state is not SandboxState.DELETED
                and (after is None or (sb.created_at, sb.id) > after)
            ),
            key=lambda sb: (sb.created_at, sb.id),
        )[:limit]
        return [
            SandboxSummary(
                sb.id,
                sb.tenant_id,
                sb.name,
                sb.template,
                sb.host_id,
                sb.state,
                dict(sb.metadata),
                sb.created_at,
                sb.warm,
            )
            for sb in got
        ]

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
