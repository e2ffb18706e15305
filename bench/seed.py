"""Running sandboxes recorded in bulk, for the benchmarks that need a full fleet: written through the
store's own transaction, many rows per statement, instead of one create (three transactions) each."""

from __future__ import annotations

import time
from collections.abc import Sequence

from corral.store import FAILOVER_ORPHAN, rows
from corral.store.sql import SqlStore

try:
    from corral.ids import new_sandbox_id as _new_id
except ImportError:  # a tree from before ids were ordered by time (compared side by side)
    from corral.control.create import new_sandbox_id as _unordered  # type: ignore[attr-defined]

    def _new_id(now: float) -> str:
        return str(_unordered())  # type: ignore[call-arg]


def sandbox_id() -> str:
    """A new sandbox id as the tree under measurement makes them."""
    return _new_id(time.time())


BATCH = 5_000
# Each column of a sandbox row by name (NULL where unnamed), so a column the schema adds cannot shift
# the values under the others.
_VALUES = {
    "id": ":id",
    "tenant_id": ":t",
    "template": "'default'",
    "host_id": ":host",
    "state": "'running'",
    "memory_mb": ":mb",
    "cpus": "1.0",
    "stateful": ":sf",
    "metadata": "'{}'",
    "created_at": ":now",
    "updated_at": ":now",
    "version": "2",
    "oom_kills": "0",
    "warm": ":warm",
    "failover": f"'{FAILOVER_ORPHAN}'",
    "epoch": "0",
}
_COLS = [c.strip() for c in rows.SANDBOX_COLS.split(",")]
_INSERT = (
    f"INSERT INTO sandboxes ({rows.SANDBOX_COLS}) VALUES ({', '.join(_VALUES.get(c, 'NULL') for c in _COLS)})"
)


async def record_running(
    store: SqlStore, tenant_id: str, placed: Sequence[tuple[str, str]], memory_mb: int, now: float
) -> None:
    """Record each (sandbox id, host id) as running, and count them in the tenant's usage."""
    for at in range(0, len(placed), BATCH):
        chunk = [
            {"id": sid, "t": tenant_id, "host": host, "mb": memory_mb, "now": now, "sf": False, "warm": False}
            for sid, host in placed[at : at + BATCH]
        ]
        await store._write(lambda tx, chunk=chunk: tx.executemany(_INSERT, chunk))  # type: ignore[misc]
    await store._write(
        lambda tx: tx.execute(
            "UPDATE tenants SET live_sandboxes = live_sandboxes + :n, live_memory_mb = live_memory_mb + :mb "
            "WHERE id = :t",
            {"n": len(placed), "mb": len(placed) * memory_mb, "t": tenant_id},
        )
    )
    if "max_cpu_m" in rows.TENANT_COLS:  # a tree whose tenants count CPU (one CPU each, as inserted)
        await store._write(
            lambda tx: tx.execute(
                "UPDATE tenants SET live_cpu_m = live_cpu_m + :m WHERE id = :t",
                {"m": len(placed) * 1000, "t": tenant_id},
            )
        )
