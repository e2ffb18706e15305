"""Host identity and token lifecycle in the store, on both backends: enrolment, rotation, forgetting a
host, configured tokens replacing their predecessors, and the revocation epoch replicas follow."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.agent.inputs import MAX_SANDBOXES_PER_HOST
from corral.core import HostFacts
from corral.store import (
    HostHasSandboxes,
    HostReport,
    Listing,
    Role,
    SandboxRecord,
    SandboxState,
    Store,
    TokenRevoked,
    open_store,
)

from .test_tenants import raw_rows


def _hb(host: str, seq: int) -> HostReport:
    return HostReport(host, seq, HostFacts(4, 0, 8192, 0, 6144))


async def test_enrolment_issues_a_host_bound_token_and_a_key_and_rotates_both(
    store: Store, store_url: str
) -> None:
    epoch = await store.auth_epoch()
    first = await store.enrol_host("h1")
    assert await store.auth_epoch() > epoch
    who = await store.resolve_token(first.agent_token)
    assert who is not None and (who.role, who.host_id, who.tenant_id) == (Role.AGENT, "h1", None)
    assert await store.host_key("h1") == first.host_key
    host = await store.get_host("h1")
    assert host is not None and host.seq == -1
    # only a hash of the agent token is stored
    stored = [str(v) for row in raw_rows(store_url, "SELECT * FROM tokens") for v in row]
    assert first.agent_token not in stored
    await store.upsert_heartbeat(_hb("h1", 2**63 - 1))
    second = await store.enrol_host("h1")
    assert await store.resolve_token(first.agent_token) is None
    assert await store.host_key("h1") == second.host_key != first.host_key
    # a new identity starts its sequence over
    assert (await store.upsert_heartbeat(_hb("h1", 5))).accepted


async def test_forgetting_a_host_revokes_its_credentials_once_it_is_empty(store: Store) -> None:
    creds = await store.enrol_host("h1")
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    await store.create_sandbox(
        SandboxRecord("sb-1", tenant.id, "default", 512, 1.0, state=SandboxState.RUNNING, host_id="h1")
    )
    with pytest.raises(HostHasSandboxes):
        await store.forget_host("h1")
    assert await store.resolve_token(creds.agent_token) is not None
    await store.set_sandbox_state("sb-1", SandboxState.DELETED)
    epoch = await store.auth_epoch()
    assert await store.forget_host("h1") is True
    assert await store.auth_epoch() > epoch
    assert await store.resolve_token(creds.agent_token) is None
    assert await store.host_key("h1") is None and await store.get_host("h1") is None
    assert await store.forget_host("h1") is False


async def test_a_configured_token_replaces_the_one_configured_before(store: Store) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    issued = await store.issue_token(tenant.id, Role.ADMIN)
    await store.adopt_token("first-admin-token-0123", tenant.id, Role.ADMIN, source="serve")
    assert await store.adopt_token("first-admin-token-0123", tenant.id, Role.ADMIN, source="serve")
    epoch = await store.auth_epoch()
    await store.adopt_token("second-admin-token-0123", tenant.id, Role.ADMIN, source="serve")
    assert await store.auth_epoch() > epoch
    assert await store.resolve_token("first-admin-token-0123") is None
    assert await store.resolve_token("second-admin-token-0123") is not None
    # tokens issued through the API are not configuration: they stay
    assert await store.resolve_token(issued) is not None
    listed = await store.list_tokens()
    assert {t.source for t in listed} == {None, "serve"} and len(listed) == 2


async def test_revoking_moves_the_epoch(store: Store) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    token = await store.issue_token(tenant.id, Role.TENANT)
    who = await store.resolve_token(token)
    assert who is not None
    [listed] = await store.list_tokens(tenant_id=tenant.id)
    assert (listed.id, listed.role, listed.tenant_id) == (who.token_id, Role.TENANT, tenant.id)
    epoch = await store.auth_epoch()
    assert await store.revoke_token(who.token_id) is True
    assert await store.auth_epoch() == epoch + 1
    assert await store.revoke_token(who.token_id) is False
    assert await store.auth_epoch() == epoch + 1


async def test_the_sqlite_files_are_owner_only(tmp_path: Path) -> None:
    # A file store's concern: its database and write-ahead files hold token hashes and host keys.
    path = str(tmp_path / "corral.db")
    store = open_store(f"sqlite:///{path}")
    try:
        await store.migrate()
        await store.enrol_host("h1")
        assert os.path.exists(path + "-wal")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                assert stat.S_IMODE(os.stat(path + suffix).st_mode) == 0o600, suffix
    finally:
        await store.close()


async def test_a_revoked_token_cannot_be_configured_again(store: Store) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    who = await store.ensure_token("configured-admin-token-0", tenant.id, Role.ADMIN)
    assert await store.revoke_token(who.token_id)
    # A replica restarted with the stale configuration must not bring it back.
    with pytest.raises(TokenRevoked):
        await store.ensure_token("configured-admin-token-0", tenant.id, Role.ADMIN)
    with pytest.raises(TokenRevoked):
        await store.adopt_token("configured-admin-token-0", tenant.id, Role.ADMIN, source="serve")
    assert await store.resolve_token("configured-admin-token-0") is None
    # so are a re-enrolled host's old token and those a configured token replaced
    old = await store.enrol_host("h1")
    await store.enrol_host("h1")
    with pytest.raises(TokenRevoked):
        await store.ensure_token(old.agent_token, None, Role.AGENT)


async def test_a_heartbeat_can_carry_the_most_sandboxes_a_host_may_report(store: Store) -> None:
    ids = frozenset(f"sb-{i:05d}" for i in range(MAX_SANDBOXES_PER_HOST))
    hb = HostReport("h1", 1, HostFacts(4, 0, 8192, 0, 6144), Listing(None, dict.fromkeys(ids, 0)))
    result = await store.upsert_heartbeat(hb)
    assert result.accepted and result.host.sandbox_count == len(ids) and result.listed_seq == 1
    assert await store.listed("h1", ["sb-00000", "sb-99999999"]) == {"sb-00000": 0}
