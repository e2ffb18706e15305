"""A sandbox's lifecycle on its record: what its timeout does, kept as created; whether it is paused
and how, set with its expiry in one write; text no lifecycle reads refused by every store."""

from __future__ import annotations

import pytest

from corral.core.lifecycle import Lifecycle, LifecycleError
from corral.store import InvalidRecord, RecordNotFound, Store, TenantRecord

from .helpers import sandbox

PAUSING = Lifecycle("pause", keep_memory=True, auto_resume=True, timeout_s=30).text()


@pytest.fixture
async def tenant(store: Store) -> TenantRecord:
    return await store.create_tenant("acme", max_sandboxes=5, max_memory_mb=4096)


async def test_the_lifecycle_is_kept_and_the_pause_set_with_the_expiry(
    store: Store, tenant: TenantRecord
) -> None:
    await store.create_sandbox(sandbox("life", tenant, lifecycle=PAUSING, expires_at=2e6))
    await store.create_sandbox(sandbox("plain", tenant))
    got = await store.get_sandbox("life")
    assert got is not None and got.lifecycle == PAUSING and got.paused is None
    assert Lifecycle.parse(got.lifecycle).auto_resume
    plain = await store.get_sandbox("plain")
    assert plain is not None and plain.lifecycle is None and Lifecycle.parse(None).on_timeout == "kill"

    paused = await store.set_sandbox_paused("life", "memory", None)
    assert (paused.paused, paused.expires_at, paused.version) == ("memory", None, got.version + 1)
    assert await store.expired_sandboxes() == []  # a paused sandbox waits to be resumed
    resumed = await store.set_sandbox_paused("life", None, 3e6)
    assert (resumed.paused, resumed.expires_at, resumed.lifecycle) == (None, 3e6, PAUSING)
    with pytest.raises(InvalidRecord):
        await store.set_sandbox_paused("life", "hibernated", None)
    with pytest.raises(RecordNotFound):
        await store.set_sandbox_paused("nope", None, None)


BAD = (
    '{"auto_resume":true,"keep_memory":true,"on_timeout":"kill","timeout_s":null}',
    '{"auto_resume":true,"keep_memory":false,"on_timeout":"pause","timeout_s":null}',
    '{"on_timeout":"pause"}',
    '{"auto_resume":false,"keep_memory":true,"on_timeout":"pause","timeout_s":-1}',
    '{"auto_resume":false, "keep_memory":true,"on_timeout":"pause","timeout_s":null}',
    "[]",
    "not json",
)


async def test_a_lifecycle_no_sandbox_can_have_is_refused(store: Store, tenant: TenantRecord) -> None:
    for bad in BAD:
        with pytest.raises(InvalidRecord):
            await store.create_sandbox(sandbox("bad", tenant, lifecycle=bad))
        with pytest.raises(LifecycleError):
            Lifecycle.parse(bad)
    with pytest.raises(InvalidRecord):
        await store.create_sandbox(sandbox("bad", tenant, paused="asleep"))
    assert await store.get_sandbox("bad") is None
