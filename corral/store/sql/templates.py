"""Templates and their warm pools (intent per pool and per host)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from corral.store import rows
from corral.store.errors import (
    InvalidRecord,
    NameConflict,
    RecordNotFound,
)
from corral.store.records import (
    PoolRecord,
    TemplateRecord,
    _Unset,
)
from corral.store.sql.base import (
    _POOLS_WITH_TARGETS,
    SqlBase,
    Tx,
)


class TemplatesSql(SqlBase):
    async def _create_template_checked(self, template: TemplateRecord) -> TemplateRecord:
        rec = replace(template, created_at=self._now())

        async def run(tx: Tx) -> TemplateRecord:
            await tx.execute(
                f"INSERT INTO templates ({rows.TEMPLATE_COLS}) VALUES (:n, :c, :m, :s, :r, :d, :now, :p, :f, :img, :cfg, :disk, :ver)",
                _template_params(rec),
            )
            return rec

        return await self._write_unique(run, f"template {template.name!r} exists")

    async def _publish_template_checked(self, template: TemplateRecord) -> TemplateRecord:
        rec = replace(template, created_at=self._now())

        async def run(tx: Tx) -> TemplateRecord:
            # A compare-and-set on the version: the record is replaced in one write, so a reader never
            # finds the name missing, and of two builds that read one version only one publishes.
            changed = await tx.execute(
                "UPDATE templates SET cpus = :c, memory_mb = :m, stateful = :s, runtime = :r,"
                " description = :d, created_at = :now, pids = :p, failover = :f, image = :img,"
                " image_config = :cfg, disk_mb = :disk, version = :ver WHERE name = :n AND version = :prev",
                {**_template_params(rec), "prev": rec.version - 1},
            )
            if changed == 0:
                raise NameConflict(f"template {rec.name!r} is not at version {rec.version - 1}")
            return rec

        return await self._write(run)

    async def get_template(self, name: str) -> TemplateRecord | None:
        sql = f"SELECT {rows.TEMPLATE_COLS} FROM templates WHERE name = :n"
        return await self._read_one(sql, {"n": name}, rows.template_from_row)

    async def list_templates(self) -> list[TemplateRecord]:
        async def run(tx: Tx) -> list[TemplateRecord]:
            got = await tx.fetchall(f"SELECT {rows.TEMPLATE_COLS} FROM templates ORDER BY name")
            return [rows.template_from_row(r) for r in got]

        return await self._read(run)

    async def _pools(self, tx: Tx, template: str | None) -> list[PoolRecord]:
        where, params = ("WHERE template = :t", {"t": template}) if template is not None else ("", {})
        found = await tx.fetchall(_POOLS_WITH_TARGETS.format(where=where), params)
        targets: dict[str, dict[str, int]] = {}
        for t, host, n in await tx.fetchall(
            f"SELECT template, host_id, target FROM pool_targets {where} ORDER BY template, host_id", params
        ):
            targets.setdefault(t, {})[host] = int(n)
        return [rows.pool_from_row(r, targets.get(r[0], {})) for r in found]

    async def _create_pool_checked(self, template: str, size: int, max_per_host: int | None) -> PoolRecord:
        now = self._now()

        async def run(tx: Tx) -> PoolRecord:
            if await tx.fetchone("SELECT 1 FROM templates WHERE name = :t", {"t": template}) is None:
                raise RecordNotFound(f"template {template!r}")
            if await tx.fetchone("SELECT 1 FROM pools WHERE template = :t", {"t": template}) is not None:
                raise NameConflict(f"template {template!r} already has a pool")
            await tx.execute(
                "INSERT INTO pools (template, size, max_per_host, created_at, updated_at) "
                "VALUES (:t, :size, :mph, :now, :now)",
                {"t": template, "size": size, "mph": max_per_host, "now": now},
            )
            return (await self._pools(tx, template))[0]

        return await self._write_unique(run, f"template {template!r} already has a pool")

    async def _update_pool_checked(
        self, template: str, size: int | None, max_per_host: int | _Unset | None
    ) -> PoolRecord:
        sets, params = ["updated_at = :now"], {"t": template, "now": self._now()}
        if size is not None:
            sets.append("size = :size")
            params["size"] = size
        if not isinstance(max_per_host, _Unset):
            sets.append("max_per_host = :mph")
            params["mph"] = max_per_host

        async def run(tx: Tx) -> PoolRecord:
            if await tx.execute(f"UPDATE pools SET {', '.join(sets)} WHERE template = :t", params) == 0:
                raise RecordNotFound(f"no pool for template {template!r}")
            return (await self._pools(tx, template))[0]

        return await self._write(run)

    async def delete_pool(self, template: str) -> bool:
        async def run(tx: Tx) -> bool:
            await tx.execute("DELETE FROM pool_targets WHERE template = :t", {"t": template})
            return await tx.execute("DELETE FROM pools WHERE template = :t", {"t": template}) > 0

        return await self._write(run)

    async def list_pools(self) -> list[PoolRecord]:
        return await self._read(lambda tx: self._pools(tx, None))

    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool:
        if any(n < 0 for n in targets.values()):
            raise InvalidRecord("targets: must not be negative")
        keep = [{"t": template, "h": h, "n": n} for h, n in sorted(targets.items()) if n > 0]

        async def run(tx: Tx) -> bool:
            if await tx.fetchone("SELECT 1 FROM pools WHERE template = :t", {"t": template}) is None:
                return False
            await tx.execute("DELETE FROM pool_targets WHERE template = :t", {"t": template})
            if keep:
                await tx.executemany(
                    "INSERT INTO pool_targets (template, host_id, target) VALUES (:t, :h, :n)", keep
                )
            return True

        return await self._write(run)

    async def images_in_use(self) -> set[str]:
        async def run(tx: Tx) -> set[str]:
            got = await tx.fetchall(
                "SELECT image FROM templates WHERE image IS NOT NULL "
                "UNION SELECT image FROM sandboxes WHERE image IS NOT NULL"
            )
            return {str(r[0]) for r in got}

        return await self._read(run)

    async def delete_template(self, name: str) -> bool:
        async def run(tx: Tx) -> bool:
            return await tx.execute("DELETE FROM templates WHERE name = :n", {"n": name}) > 0

        return await self._write(run)


def _template_params(rec: TemplateRecord) -> dict[str, object]:
    return {
        "n": rec.name,
        "c": rec.cpus,
        "m": rec.memory_mb,
        "s": bool(rec.stateful),
        "r": rec.runtime,
        "d": rec.description,
        "now": rec.created_at,
        "p": rec.pids,
        "f": rec.failover,
        "img": rec.image,
        "cfg": rows.image_config_text(rec.image_config),
        "disk": rec.disk_mb,
        "ver": rec.version,
    }
