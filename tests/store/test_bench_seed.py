"""The benchmarks' bulk writer of running sandboxes writes rows every reader takes for what a create
makes, whatever columns the schema has grown since it was written."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from corral.store import SandboxState, Store, Usage
from corral.store.sql import SqlStore

from .helpers import beat


def _seed_module():  # type: ignore[no-untyped-def]
    path = Path(__file__).resolve().parents[2] / "bench" / "seed.py"
    spec = importlib.util.spec_from_file_location("bench_seed", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_bulk_recorded_sandboxes_read_as_running(store: Store) -> None:
    assert isinstance(store, SqlStore)
    tenant = await store.create_tenant("fleet", max_sandboxes=10, max_memory_mb=10_000)
    await store.upsert_heartbeat(beat("h1", 1))
    placed = [(f"sb-{i}", "h1") for i in range(3)]
    await _seed_module().record_running(store, tenant.id, placed, 256, 1_000_000.0)
    got = await store.get_sandboxes([sid for sid, _ in placed])
    assert sorted(got) == ["sb-0", "sb-1", "sb-2"]
    assert all(
        r.state is SandboxState.RUNNING and r.host_id == "h1" and r.memory_mb == 256 for r in got.values()
    )
    usage = await store.usage(tenant.id)
    assert usage == Usage(3, 768, 3.0)
    assert await store.audit() == []
