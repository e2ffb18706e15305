"""A sandbox's egress policy on its record: kept as created, replaced in place, checked by every store."""

from __future__ import annotations

import pytest

from corral.core.netpolicy import INTERNET, parse_policy
from corral.store import InvalidRecord, RecordNotFound, Store, TenantRecord
from corral.store.records import network_text

from .helpers import sandbox


@pytest.fixture
async def tenant(store: Store) -> TenantRecord:
    return await store.create_tenant("acme", max_sandboxes=5, max_memory_mb=4096)


async def test_the_policy_is_kept_and_replaced(store: Store, tenant: TenantRecord) -> None:
    listed = network_text(parse_policy({"allow_out": ["198.51.100.0/24"], "deny_out": ["0.0.0.0/0"]}))
    await store.create_sandbox(sandbox("net", tenant, network=listed))
    await store.create_sandbox(sandbox("plain", tenant))
    got = await store.get_sandbox("net")
    assert got is not None and got.network == listed
    plain = await store.get_sandbox("plain")
    assert plain is not None and plain.network is None  # mode none: no interface
    changed = await store.set_sandbox_network("net", network_text(INTERNET))
    assert changed.network == network_text(INTERNET) and changed.version == got.version + 1
    assert (await store.set_sandbox_network("net", None)).network is None
    with pytest.raises(RecordNotFound):
        await store.set_sandbox_network("nope", None)


@pytest.mark.parametrize(
    "bad",
    [
        '{"mode": "internet", "allow_out": ["example.com"], "deny_out": []}',
        "[]",
        "not json",
        '{"mode":"internet"}',
    ],
)
async def test_a_policy_no_host_could_enforce_is_refused(
    store: Store, tenant: TenantRecord, bad: str
) -> None:
    with pytest.raises(InvalidRecord):
        await store.create_sandbox(sandbox("bad", tenant, network=bad))
    await store.create_sandbox(sandbox("ok", tenant))
    with pytest.raises(InvalidRecord):
        await store.set_sandbox_network("ok", bad)
