"""Tenants and their quotas, API tokens and their revocation epoch, host enrolment and fleet secrets."""

from __future__ import annotations

import re
import secrets

from corral.shapes import ID_PATTERN
from corral.shapes.hosts import HostCredentials
from corral.store import rows
from corral.store.errors import (
    HostHasSandboxes,
    InvalidRecord,
    NameConflict,
    RecordNotFound,
    TenantHasSandboxes,
    TokenRevoked,
)
from corral.store.records import (
    DEFAULT_MAX_CPUS,
    LIVE_STATES,
    REMOVED_WITH_TENANT,
    Principal,
    Role,
    TenantRecord,
    TokenRecord,
    Usage,
    check_create_rate,
    check_tenant,
    check_tenant_quota,
    from_millicores,
    to_millicores,
)
from corral.store.rows import in_list
from corral.store.sql.base import (
    _TOKEN_PREFIX,
    UNINDEXED_STATE,
    Params,
    SqlBase,
    Tx,
    token_hash,
)


class AccessSql(SqlBase):
    async def _usage(self, tx: Tx, tenant_id: str) -> Usage:
        row = await tx.fetchone(
            "SELECT live_sandboxes, live_memory_mb, live_cpu_m FROM tenants WHERE id = :t", {"t": tenant_id}
        )
        if row is None:
            return Usage(0, 0, 0.0)
        return Usage(int(row[0]), int(row[1]), from_millicores(int(row[2])))

    async def create_tenant(
        self, name: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float = DEFAULT_MAX_CPUS
    ) -> TenantRecord:
        check_tenant(name, max_sandboxes, max_memory_mb, max_cpus)
        cpu_m = to_millicores(max_cpus)
        rec = TenantRecord(
            "tn_" + secrets.token_hex(8),
            name,
            max_sandboxes,
            max_memory_mb,
            self._now(),
            from_millicores(cpu_m),
        )

        async def run(tx: Tx) -> TenantRecord:
            await tx.execute(
                f"INSERT INTO tenants ({rows.TENANT_COLS}) VALUES (:id, :n, :ms, :mm, :now, :mc, NULL, NULL)",
                {
                    "id": rec.id,
                    "n": name,
                    "ms": max_sandboxes,
                    "mm": max_memory_mb,
                    "now": rec.created_at,
                    "mc": cpu_m,
                },
            )
            return rec

        return await self._write_unique(run, f"tenant {name!r} exists")

    async def _tenant_where(self, where: str, params: Params) -> list[TenantRecord]:
        async def run(tx: Tx) -> list[TenantRecord]:
            got = await tx.fetchall(f"SELECT {rows.TENANT_COLS} FROM tenants {where}", params)
            return [rows.tenant_from_row(r) for r in got]

        return await self._read(run)

    async def get_tenant(self, tenant_id: str) -> TenantRecord | None:
        got = await self._tenant_where("WHERE id = :id", {"id": tenant_id})
        return got[0] if got else None

    async def get_tenant_by_name(self, name: str) -> TenantRecord | None:
        got = await self._tenant_where("WHERE name = :n", {"n": name})
        return got[0] if got else None

    async def list_tenants(self) -> list[TenantRecord]:
        return await self._tenant_where("ORDER BY name", {})

    async def set_quota(
        self, tenant_id: str, *, max_sandboxes: int, max_memory_mb: int, max_cpus: float | None = None
    ) -> TenantRecord:
        check_tenant_quota(max_sandboxes, max_memory_mb, 0.0 if max_cpus is None else max_cpus)
        params: dict[str, object] = {"id": tenant_id, "ms": max_sandboxes, "mm": max_memory_mb}
        cpus = ""
        if max_cpus is not None:
            cpus, params["mc"] = ", max_cpu_m = :mc", to_millicores(max_cpus)

        async def run(tx: Tx) -> TenantRecord:
            row = await tx.fetchone(
                f"UPDATE tenants SET max_sandboxes = :ms, max_memory_mb = :mm{cpus} WHERE id = :id "
                f"RETURNING {rows.TENANT_COLS}",
                params,
            )
            if row is None:
                raise RecordNotFound(f"tenant {tenant_id!r}")
            return rows.tenant_from_row(row)

        return await self._write(run)

    async def set_create_rate(
        self, tenant_id: str, *, rate_per_s: float | None, burst: int | None
    ) -> TenantRecord:
        check_create_rate(rate_per_s, burst)

        async def run(tx: Tx) -> TenantRecord:
            row = await tx.fetchone(
                f"UPDATE tenants SET create_rate = :r, create_burst = :b WHERE id = :id RETURNING {rows.TENANT_COLS}",
                {"id": tenant_id, "r": rate_per_s, "b": burst},
            )
            if row is None:
                raise RecordNotFound(f"tenant {tenant_id!r}")
            return rows.tenant_from_row(row)

        return await self._write(run)

    async def delete_tenant(self, tenant_id: str) -> bool:
        live, live_params = in_list("l", sorted(s.value for s in LIVE_STATES))
        ended, ended_params = in_list("e", sorted(s.value for s in REMOVED_WITH_TENANT))
        t = {"t": tenant_id}

        async def run(tx: Tx) -> bool:
            # The tenant's row lock first: every create of its sandboxes takes that lock to count its
            # quota, so none commits between the count below and the delete (SQLite: one writer).
            if await tx.fetchone(f"SELECT id FROM tenants WHERE id = :t{self.for_update}", t) is None:
                return False
            # By the tenant's own index (``UNINDEXED_STATE``), not the state index: most are running.
            row = await tx.fetchone(
                f"SELECT count(*) FROM sandboxes WHERE tenant_id = :t AND {UNINDEXED_STATE} IN {live}",
                {**t, **live_params},
            )
            if row is not None and int(row[0]) > 0:
                raise TenantHasSandboxes(tenant_id, int(row[0]))
            await tx.execute(
                f"DELETE FROM sandboxes WHERE tenant_id = :t AND {UNINDEXED_STATE} IN {ended}",
                {**t, **ended_params},
            )
            await tx.execute("DELETE FROM idempotency_keys WHERE tenant_id = :t", t)
            await tx.execute("DELETE FROM sandbox_domains WHERE tenant_id = :t", t)
            await self._revoke_where(tx, "tenant_id = :t", t)
            return await tx.execute("DELETE FROM tenants WHERE id = :t", t) > 0

        return await self._write(run)

    async def usage(self, tenant_id: str) -> Usage:
        return await self._read(lambda tx: self._usage(tx, tenant_id))

    async def issue_token(self, tenant_id: str | None, role: Role) -> str:
        plaintext = _TOKEN_PREFIX + secrets.token_urlsafe(32)
        await self.ensure_token(plaintext, tenant_id, role)
        return plaintext

    async def ensure_token(self, plaintext: str, tenant_id: str | None, role: Role) -> Principal:
        return await self._ensure_token(plaintext, tenant_id, role, None)

    async def adopt_token(
        self, plaintext: str, tenant_id: str | None, role: Role, *, source: str
    ) -> Principal:
        return await self._ensure_token(plaintext, tenant_id, role, source)

    async def _ensure_token(
        self, plaintext: str, tenant_id: str | None, role: Role, source: str | None
    ) -> Principal:
        if len(plaintext) < 16:
            raise InvalidRecord("token: must be at least 16 characters")
        try:
            want = Role(role)
        except ValueError as exc:
            raise InvalidRecord(f"role: {exc}") from exc
        if want is Role.TENANT and tenant_id is None:
            raise InvalidRecord("tenant_id: a tenant token needs a tenant")
        digest = token_hash(plaintext)
        token_id = "tok_" + secrets.token_hex(8)
        now = self._now()

        async def run(tx: Tx) -> Principal:
            if (
                tenant_id is not None
                and await tx.fetchone("SELECT id FROM tenants WHERE id = :t", {"t": tenant_id}) is None
            ):
                raise RecordNotFound(f"tenant {tenant_id!r}")
            if await tx.fetchone("SELECT 1 FROM revoked_tokens WHERE hash = :h", {"h": digest}):
                raise TokenRevoked("this token was revoked; configure a new one")
            await tx.execute(
                "INSERT INTO tokens (id, hash, tenant_id, role, created_at, source) "
                "VALUES (:id, :h, :t, :r, :now, :src) ON CONFLICT (hash) DO NOTHING",
                {"id": token_id, "h": digest, "t": tenant_id, "r": want.value, "now": now, "src": source},
            )
            row = await tx.fetchone(
                "SELECT id, tenant_id, role, host_id FROM tokens WHERE hash = :h", {"h": digest}
            )
            assert row is not None
            if row[1] != tenant_id or row[2] != want.value or row[3] is not None:
                raise NameConflict("this token is already stored for another tenant or role")
            if source is not None:
                await tx.execute(
                    "UPDATE tokens SET source = :src WHERE id = :id", {"src": source, "id": row[0]}
                )
                await self._revoke_where(
                    tx,
                    "source = :src AND role = :r AND id <> :id",
                    {"src": source, "r": want.value, "id": row[0]},
                )
            return Principal(row[0], row[1], Role(row[2]))

        return await self._write(run)

    async def resolve_token(self, plaintext: str) -> Principal | None:
        digest = token_hash(plaintext)

        async def run(tx: Tx) -> Principal | None:
            row = await tx.fetchone(
                "SELECT id, tenant_id, role, host_id FROM tokens WHERE hash = :h", {"h": digest}
            )
            return Principal(row[0], row[1], Role(row[2]), row[3]) if row is not None else None

        return await self._read(run)

    @staticmethod
    async def _bump_epoch(tx: Tx) -> None:
        await tx.execute("UPDATE auth_epoch SET epoch = epoch + 1 WHERE id = 1")

    async def _revoke_where(self, tx: Tx, where: str, params: Params) -> int:
        """Revoke every token matching ``where`` in this transaction: remember its hash, delete it, and
        advance the epoch replicas follow. Returns how many."""
        await tx.execute(
            f"INSERT INTO revoked_tokens (hash, revoked_at) SELECT hash, :revoked_at FROM tokens WHERE {where} "
            "ON CONFLICT (hash) DO NOTHING",
            {**params, "revoked_at": self._now()},
        )
        gone = await tx.execute(f"DELETE FROM tokens WHERE {where}", params)
        if gone:
            await self._bump_epoch(tx)
        return gone

    async def revoke_token(self, token_id: str) -> bool:
        async def run(tx: Tx) -> bool:
            return await self._revoke_where(tx, "id = :id", {"id": token_id}) > 0

        return await self._write(run)

    async def list_tokens(self, *, tenant_id: str | None = None) -> list[TokenRecord]:
        where = "" if tenant_id is None else "WHERE tenant_id = :t"

        async def run(tx: Tx) -> list[TokenRecord]:
            got = await tx.fetchall(
                f"SELECT id, role, tenant_id, host_id, source, created_at FROM tokens {where} "
                "ORDER BY created_at, id",
                {"t": tenant_id},
            )
            return [TokenRecord(r[0], Role(r[1]), r[2], r[3], r[4], float(r[5])) for r in got]

        return await self._read(run)

    async def auth_epoch(self) -> int:
        async def run(tx: Tx) -> int:
            row = await tx.fetchone("SELECT epoch FROM auth_epoch WHERE id = 1")
            return int(row[0]) if row is not None else 0

        return await self._read(run)

    async def fleet_secret(self, name: str) -> str:
        if not name:
            raise InvalidRecord("name: must not be empty")
        made = secrets.token_urlsafe(32)

        async def run(tx: Tx) -> str:
            # Two replicas asking at once: the first insert wins and both read what it wrote.
            await tx.execute(
                "INSERT INTO fleet_secrets (name, value, created_at) VALUES (:n, :v, :now) "
                "ON CONFLICT (name) DO NOTHING",
                {"n": name, "v": made, "now": self._now()},
            )
            row = await tx.fetchone("SELECT value FROM fleet_secrets WHERE name = :n", {"n": name})
            assert row is not None
            return str(row[0])

        return await self._write(run)

    async def enrol_host(self, host_id: str) -> HostCredentials:
        if not re.match(ID_PATTERN, host_id):
            raise InvalidRecord("host_id: letters, digits, '_', '.' and '-', up to 128, not empty")
        creds = HostCredentials(
            host_id=host_id,
            agent_token=_TOKEN_PREFIX + secrets.token_urlsafe(32),
            host_key=secrets.token_urlsafe(32),
        )
        now = self._now()

        async def run(tx: Tx) -> HostCredentials:
            # A new identity starts its sequence over: whatever the previous credentials sent no
            # longer binds the host.
            await tx.execute(
                "INSERT INTO hosts (id, registered_at) VALUES (:id, :now) "
                "ON CONFLICT (id) DO UPDATE SET seq = -1",
                {"id": host_id, "now": now},
            )
            await self._revoke_where(tx, "host_id = :h", {"h": host_id})
            await tx.execute(
                "INSERT INTO tokens (id, hash, tenant_id, role, created_at, host_id) "
                "VALUES (:id, :h, NULL, :r, :now, :host)",
                {
                    "id": "tok_" + secrets.token_hex(8),
                    "h": token_hash(creds.agent_token),
                    "r": Role.AGENT.value,
                    "now": now,
                    "host": host_id,
                },
            )
            await tx.execute(
                "INSERT INTO host_keys (host_id, key, created_at) VALUES (:h, :k, :now) "
                "ON CONFLICT (host_id) DO UPDATE SET key = excluded.key, created_at = excluded.created_at",
                {"h": host_id, "k": creds.host_key, "now": now},
            )
            await self._bump_epoch(tx)
            return creds

        return await self._write(run)

    async def host_key(self, host_id: str) -> str | None:
        async def run(tx: Tx) -> str | None:
            row = await tx.fetchone("SELECT key FROM host_keys WHERE host_id = :h", {"h": host_id})
            return str(row[0]) if row is not None else None

        return await self._read(run)

    async def forget_host(self, host_id: str) -> bool:
        clause, params = in_list("s", sorted(s.value for s in LIVE_STATES))

        async def run(tx: Tx) -> bool:
            live = await tx.fetchone(
                f"SELECT count(*) FROM sandboxes WHERE host_id = :h AND state IN {clause}",
                {"h": host_id, **params},
            )
            if live is not None and int(live[0]) > 0:
                raise HostHasSandboxes(f"host {host_id} has {int(live[0])} live sandboxes")
            await self._end_where(tx, "host_id = :h", {"h": host_id})
            await tx.execute("DELETE FROM listed_sandboxes WHERE host_id = :h", {"h": host_id})
            found = await tx.execute("DELETE FROM hosts WHERE id = :h", {"h": host_id}) > 0
            found = await tx.execute("DELETE FROM host_keys WHERE host_id = :h", {"h": host_id}) > 0 or found
            return await self._revoke_where(tx, "host_id = :h", {"h": host_id}) > 0 or found

        return await self._write(run)
