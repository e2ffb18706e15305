"""What no store takes, refused alike by SQLite, PostgreSQL and the in-memory model: the record checks
are declared once (:mod:`corral.store.records`) and every backend calls them. A claim of no memory is
no sandbox's, so a reservation of 0 MiB is refused everywhere (the API refuses a create of
``memory_mb: 0`` with a 422 before any store sees it)."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.core import ManualClock
from corral.store import InvalidRecord, ReserveItem, SandboxRecord, TemplateRecord, open_store
from corral.testing.store import ModelStore
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema
from tests.store.helpers import beat

T0 = 1_000_000.0


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres), "model"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Any]:
    clock = ManualClock(T0)
    if request.param == "model":
        yield ModelStore(clock, random.Random(0))
        return
    base = require_pg() if request.param == "postgres" else ""
    schema = new_schema_name("corral_checks") if base else ""
    s = open_store(with_schema(base, schema) if base else f"sqlite:///{tmp_path / 'c.db'}", clock=clock)
    await s.migrate()
    try:
        yield s
    finally:
        await s.close()
        if base:
            drop_schema(base, schema)


@pytest.mark.parametrize(
    ("memory_mb", "cpu", "ttl_s"), [(0, 0.5, 30.0), (-1, 0.5, 30.0), (512, -1.0, 30.0), (512, 0.5, 0.0)]
)
async def test_a_bad_claim_is_refused_by_every_way_of_reserving(
    store: Any, memory_mb: int, cpu: float, ttl_s: float
) -> None:
    await store.upsert_heartbeat(beat("h00", 1))
    claim = {"memory_mb": memory_mb, "cpu": cpu, "owner": "r1", "ttl_s": ttl_s}
    with pytest.raises(InvalidRecord):
        await store.reserve("h00", **claim)
    with pytest.raises(InvalidRecord):
        await store.reserve_best(["h00"], **claim)
    with pytest.raises(InvalidRecord):
        await store.reserve_batch([ReserveItem("h00", memory_mb, cpu)], owner="r1", ttl_s=ttl_s)
    assert await store.get_host("h00") is not None
    assert (await store.get_host("h00")).reserved_mb == 0


async def test_a_bad_sandbox_record_is_refused(store: Any) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=100_000)
    for bad in (
        SandboxRecord("", tenant.id, "default", 512, 1.0),
        SandboxRecord("x", "", "default", 512, 1.0),
        SandboxRecord("x", tenant.id, "default", 0, 1.0),
        SandboxRecord("x", tenant.id, "default", 512, -1.0),
        SandboxRecord("x", tenant.id, "default", 512, 1.0, name=""),
        SandboxRecord("x", tenant.id, "default", 512, 1.0, failover="sometimes"),
        SandboxRecord("x", tenant.id, "default", 512, 1.0, state="limbo"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidRecord):
            await store.check_create(bad)
        with pytest.raises(InvalidRecord):
            await store.create_sandbox(bad)
    assert (await store.usage(tenant.id)).sandboxes == 0


async def test_a_bad_template_is_refused(store: Any) -> None:
    for bad in (
        TemplateRecord(name="", cpus=1.0, memory_mb=512),
        TemplateRecord(name="t", cpus=1.0, memory_mb=0),
        TemplateRecord(name="t", cpus=0.0, memory_mb=512),
        TemplateRecord(name="t", cpus=1.0, memory_mb=512, pids=0),
        TemplateRecord(name="t", cpus=1.0, memory_mb=512, failover="sometimes"),
    ):
        with pytest.raises(InvalidRecord):
            await store.create_template(bad)
        with pytest.raises(InvalidRecord):
            await store.publish_template(bad)
    await store.create_template(TemplateRecord(name="t", cpus=1.0, memory_mb=512))
    with pytest.raises(InvalidRecord):
        await store.publish_template(TemplateRecord(name="t", cpus=1.0, memory_mb=0, version=2))
    assert [(t.name, t.version, t.memory_mb) for t in await store.list_templates()] == [
        ("default", 1, 512),
        ("t", 1, 512),
    ]


async def test_a_bad_pool_is_refused_and_a_template_goes_alike(store: Any) -> None:
    await store.create_template(TemplateRecord(name="t", cpus=1.0, memory_mb=512))
    for size, max_per_host in ((-1, None), (1, 0)):
        with pytest.raises(InvalidRecord):
            await store.create_pool("t", size=size, max_per_host=max_per_host)
    assert await store.list_pools() == []
    await store.create_pool("t", size=1)
    with pytest.raises(InvalidRecord):
        await store.update_pool("t", size=-1)
    assert [p.size for p in await store.list_pools()] == [1]
    await store.delete_pool("t")
    assert await store.delete_template("t") is True
    assert await store.delete_template("t") is False
    assert [t.name for t in await store.list_templates()] == ["default"]
