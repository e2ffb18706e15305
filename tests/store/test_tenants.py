"""Tenants, API tokens (stored hashed), templates."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest

from corral.store import (
    InvalidRecord,
    NameConflict,
    Principal,
    RecordNotFound,
    Role,
    SandboxRecord,
    SandboxState,
    Store,
    TemplateRecord,
    Usage,
)

from .conftest import T0


def raw_rows(store_url: str, query: str) -> list[tuple[object, ...]]:
    """Read the tables behind the store's back (to check what is really stored)."""
    if store_url.startswith("sqlite:///"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            return list(conn.execute(query))
    base, _, schema = store_url.partition("?schema=")
    with psycopg.connect(base, options=f"-c search_path={schema}") as conn:
        return list(conn.execute(query))


async def test_tenants(store: Store) -> None:
    a = await store.create_tenant("acme", max_sandboxes=10, max_memory_mb=8192)
    assert a.id.startswith("tn_") and (a.name, a.max_sandboxes, a.max_memory_mb, a.created_at) == (
        "acme",
        10,
        8192,
        T0,
    )
    b = await store.create_tenant("beta", max_sandboxes=1, max_memory_mb=1)
    with pytest.raises(NameConflict):
        await store.create_tenant("acme", max_sandboxes=1, max_memory_mb=1)
    with pytest.raises(InvalidRecord):
        await store.create_tenant("", max_sandboxes=1, max_memory_mb=1)
    with pytest.raises(InvalidRecord):
        await store.create_tenant("neg", max_sandboxes=-1, max_memory_mb=1)
    assert await store.get_tenant(a.id) == a
    assert await store.get_tenant_by_name("beta") == b
    assert await store.get_tenant("nope") is None and await store.get_tenant_by_name("nope") is None
    assert await store.list_tenants() == [a, b]
    raised = await store.set_quota(b.id, max_sandboxes=5, max_memory_mb=5000)
    assert (raised.max_sandboxes, raised.max_memory_mb) == (5, 5000)
    with pytest.raises(RecordNotFound):
        await store.set_quota("nope", max_sandboxes=1, max_memory_mb=1)
    assert (await store.usage(a.id)).sandboxes == 0


async def test_tokens_are_stored_hashed_and_resolve(store: Store, store_url: str) -> None:
    t = await store.create_tenant("acme", max_sandboxes=1, max_memory_mb=1)
    plain = await store.issue_token(t.id, Role.TENANT)
    admin = await store.issue_token(None, Role.ADMIN)
    principal = await store.resolve_token(plain)
    assert principal is not None and (principal.tenant_id, principal.role) == (t.id, Role.TENANT)
    assert (await store.resolve_token(admin)) == Principal(
        (await store.resolve_token(admin)).token_id,  # type: ignore[union-attr]
        None,
        Role.ADMIN,
    )
    assert await store.resolve_token(plain + "x") is None
    stored = raw_rows(store_url, "SELECT hash FROM tokens")
    assert len(stored) == 2 and all(plain not in str(row) and admin not in str(row) for row in stored)
    assert await store.revoke_token(principal.token_id) is True
    assert await store.revoke_token(principal.token_id) is False
    assert await store.resolve_token(plain) is None


async def test_ensure_token_is_idempotent(store: Store) -> None:
    t = await store.create_tenant("acme", max_sandboxes=1, max_memory_mb=1)
    given = "agent-token-from-the-environment"
    first = await store.ensure_token(given, None, Role.AGENT)
    assert await store.ensure_token(given, None, Role.AGENT) == first
    assert await store.resolve_token(given) == first
    with pytest.raises(NameConflict):
        await store.ensure_token(given, None, Role.ADMIN)
    with pytest.raises(NameConflict):
        await store.ensure_token(given, t.id, Role.AGENT)
    with pytest.raises(InvalidRecord):
        await store.ensure_token("short", None, Role.AGENT)
    with pytest.raises(InvalidRecord):
        await store.ensure_token("a-tenant-token-without-tenant", None, Role.TENANT)
    with pytest.raises(RecordNotFound):
        await store.ensure_token("a-token-for-a-ghost-tenant", "tn_ghost", Role.TENANT)


async def test_templates(store: Store) -> None:
    default = await store.get_template("default")
    assert default is not None and (default.cpus, default.memory_mb, default.stateful) == (1.0, 512, False)
    py = await store.create_template(
        TemplateRecord("python", 2.0, 2048, stateful=True, runtime="process", description="py")
    )
    assert py.created_at == T0 and py.pids == 512  # the default pids limit
    assert await store.get_template("python") == py
    small = await store.create_template(TemplateRecord("small", 1.0, 256, pids=64))
    assert (await store.get_template("small")) == small and small.pids == 64
    for pids in (0, 7, 1 << 23):
        with pytest.raises(InvalidRecord):
            await store.create_template(TemplateRecord("bad-pids", 1.0, 256, pids=pids))
    assert [t.name for t in await store.list_templates()] == ["default", "python", "small"]
    with pytest.raises(NameConflict):
        await store.create_template(TemplateRecord("python", 1.0, 512))
    with pytest.raises(InvalidRecord):
        await store.create_template(TemplateRecord("zero", 1.0, 0))
    assert await store.delete_template("python") is True
    assert await store.delete_template("python") is False
    assert await store.get_template("python") is None


async def test_usage_counters_follow_every_change(store: Store) -> None:
    tenant = await store.create_tenant("counted", max_sandboxes=100, max_memory_mb=10**6)

    def rec(i: int, mb: int, cpus: float) -> SandboxRecord:
        return SandboxRecord(id=f"sb-c{i}", tenant_id=tenant.id, template="default", memory_mb=mb, cpus=cpus)

    for i, (mb, cpus) in enumerate([(512, 0.5), (1024, 1.25), (2048, 2.0)]):
        await store.create_sandbox(rec(i, mb, cpus))
    assert await store.usage(tenant.id) == Usage(3, 3584, 3.75)
    await store.set_sandbox_state("sb-c0", SandboxState.RUNNING, expect=SandboxState.RESERVED)
    assert await store.usage(tenant.id) == Usage(3, 3584, 3.75)
    await store.set_sandbox_state("sb-c1", SandboxState.STOPPED)  # leaves the live states
    assert await store.usage(tenant.id) == Usage(2, 2560, 2.5)
    await store.set_sandbox_state("sb-c1", SandboxState.ORPHANED)  # and comes back
    assert await store.usage(tenant.id) == Usage(3, 3584, 3.75)
    await store.delete_sandbox("sb-c2")
    await store.set_sandbox_state("sb-c0", SandboxState.FAILED, expect=[SandboxState.RUNNING])
    assert await store.usage(tenant.id) == Usage(1, 1024, 1.25)
    assert await store.audit() == []


async def test_a_tenants_create_rate_is_kept_cleared_and_checked(store: Store) -> None:
    t = await store.create_tenant("paced", max_sandboxes=5, max_memory_mb=5000)
    assert (t.create_rate_per_s, t.create_burst) == (None, None)  # the control plane's default
    set_ = await store.set_create_rate(t.id, rate_per_s=2.5, burst=7)
    assert (set_.create_rate_per_s, set_.create_burst) == (2.5, 7)
    assert await store.get_tenant(t.id) == set_ and (await store.list_tenants()) == [set_]
    # a quota change leaves the rate alone, and the rate clears back to the default
    quota = await store.set_quota(t.id, max_sandboxes=9, max_memory_mb=9000)
    assert (quota.create_rate_per_s, quota.create_burst) == (2.5, 7)
    cleared = await store.set_create_rate(t.id, rate_per_s=None, burst=None)
    assert (cleared.create_rate_per_s, cleared.create_burst, cleared.max_sandboxes) == (None, None, 9)
    for rate, burst in [(0.0, None), (-1.0, None), (float("inf"), None), (float("nan"), None), (None, 0)]:
        with pytest.raises(InvalidRecord):
            await store.set_create_rate(t.id, rate_per_s=rate, burst=burst)
    with pytest.raises(RecordNotFound):
        await store.set_create_rate("nope", rate_per_s=1.0, burst=1)
