"""Token lifecycle on control-plane objects sharing one store: a revocation reaches a replica that
cached the token once it next reads the revocation epoch (at most ``REVOCATION_POLL_S`` later), and
``corral serve`` restarted with another admin token leaves the previous one dead."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from random import Random

import httpx
import pytest

from corral.api.app import create_app
from corral.client import AsyncCorral, NotFound, Unauthorized
from corral.clock import SystemClock
from corral.control import errors
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.plane import REVOCATION_POLL_S, ControlPlane, build_replica
from corral.core import ManualClock
from corral.store import Role, TokenRevoked, open_store

from .conftest import ADMIN, Cluster


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[tuple[ControlPlane, ControlPlane, ManualClock]]:
    clock = ManualClock(1_000_000.0)
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    a = build_replica(
        open_store(url, clock=clock), LocalAgents(), ControlConfig(replica_id="a"), clock, Random()
    )
    b = build_replica(
        open_store(url, clock=clock), LocalAgents(), ControlConfig(replica_id="b"), clock, Random()
    )
    await a.start(admin_token="admin-token-for-planes")
    await b.start(admin_token="admin-token-for-planes")
    try:
        yield a, b, clock
    finally:
        for p in (a, b):
            await p.stop()
            await p.store.close()


async def test_a_revocation_reaches_the_other_replica_within_its_poll(
    planes: tuple[ControlPlane, ControlPlane, ManualClock],
) -> None:
    a, b, clock = planes
    _, token = await a.create_tenant("acme", 10, 10_000)
    who = await b.authenticate(token)  # b now holds it in its cache
    assert who.role is Role.TENANT
    admin = await a.authenticate("admin-token-for-planes")
    await a.revoke_token(who.token_id, admin)
    with pytest.raises(errors.Unauthorized):
        await a.authenticate(token)  # the replica that revoked it: at once
    # The other replica follows the store's epoch: once its poll interval has passed, it is refused.
    clock.advance(REVOCATION_POLL_S)
    with pytest.raises(errors.Unauthorized):
        await b.authenticate(token)
    # ...and a token nobody revoked keeps working through the cache flush
    assert (await b.authenticate("admin-token-for-planes")).role is Role.ADMIN


async def test_reenrolment_reaches_the_other_replica(
    planes: tuple[ControlPlane, ControlPlane, ManualClock],
) -> None:
    a, b, clock = planes
    old = await a.enrol_host("h1")
    assert (await b.authenticate(old.agent_token)).host_id == "h1"
    await a.enrol_host("h1")
    clock.advance(REVOCATION_POLL_S)
    with pytest.raises(errors.Unauthorized):
        await b.authenticate(old.agent_token)


async def test_a_token_cannot_revoke_itself(planes: tuple[ControlPlane, ControlPlane, ManualClock]) -> None:
    a, _, _ = planes
    admin = await a.authenticate("admin-token-for-planes")
    with pytest.raises(errors.Forbidden):
        await a.revoke_token(admin.token_id, admin)


async def test_serve_restarted_with_another_admin_token_revokes_the_previous_one(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'serve.db'}"
    issued = ""
    for token in ("first-serve-admin-token", "second-serve-admin-token"):
        plane = build_replica(
            open_store(url), LocalAgents(), ControlConfig(replica_id="serve"), SystemClock(), Random()
        )
        await plane.start(admin_token=token, replace_admin_token=True)
        try:
            if not issued:  # a token an operator issued through the API is theirs to revoke, not serve's
                issued = await plane.issue_admin_token()
            else:
                with pytest.raises(errors.Unauthorized):
                    await plane.authenticate("first-serve-admin-token")
            assert (await plane.authenticate(token)).role is Role.ADMIN
            assert (await plane.authenticate(issued)).role is Role.ADMIN
        finally:
            await plane.stop()
            await plane.store.close()
    # and going back to the first one is refused: a revoked token stays revoked
    plane = build_replica(
        open_store(url), LocalAgents(), ControlConfig(replica_id="serve"), SystemClock(), Random()
    )
    try:
        with pytest.raises(TokenRevoked):
            await plane.start(admin_token="first-serve-admin-token", replace_admin_token=True)
    finally:
        await plane.stop()
        await plane.store.close()


async def test_the_sdk_rotates_a_tenant_token_and_enrols_and_forgets_a_host(cluster: Cluster) -> None:
    transport = httpx.ASGITransport(app=create_app(cluster.plane, manage=False))
    async with AsyncCorral("http://corral.test", ADMIN, transport=transport) as admin:
        r = await cluster.http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))
        old = r.json()["token"]
        new = await admin.tokens.issue_tenant("acme")
        old_id = next(t.id for t in await admin.tokens.list() if t.tenant == new.tenant and t.id != new.id)
        await admin.tokens.revoke(old_id)
        with pytest.raises(NotFound):
            await admin.tokens.revoke(old_id)
        async with AsyncCorral("http://corral.test", old, transport=transport) as tenant:
            with pytest.raises(Unauthorized):
                await tenant.sandboxes.list().__anext__()
        async with AsyncCorral("http://corral.test", new.token, transport=transport) as tenant:
            sb = await tenant.sandboxes.create("default", memory_mb=256)
            await sb.kill()
        creds = await admin.hosts.enrol("h-new")
        assert creds.host_id == "h-new" and creds.agent_token != creds.host_key
        await admin.hosts.forget("h-new")
        with pytest.raises(NotFound):
            await admin.hosts.forget("h-new")


async def test_only_an_admin_reaches_the_identity_routes(cluster: Cluster) -> None:
    r = await cluster.http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))
    tenant = r.json()["token"]
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    host = cluster.fleet.agents[0].id
    for token in (tenant, creds.agent_token):
        for method, path in [
            ("POST", f"/v1/hosts/{host}/token"),
            ("POST", "/v1/hosts/h-new/token"),
            ("DELETE", f"/v1/hosts/{host}"),
            ("GET", "/v1/tokens"),
            ("POST", "/v1/tokens/admin"),
            ("POST", "/v1/tenants/acme/tokens"),
            ("DELETE", f"/v1/tokens/{(await cluster.plane.authenticate(ADMIN)).token_id}"),
        ]:
            r = await cluster.http.request(method, path, headers=cluster.as_(token))
            assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", (method, path, r.text)
    # nothing changed: the host's credentials still work, the admin token too
    assert (await cluster.plane.authenticate(creds.agent_token)).host_id == host
    assert (await cluster.http.get("/v1/tokens", headers=cluster.as_(ADMIN))).status_code == 200
