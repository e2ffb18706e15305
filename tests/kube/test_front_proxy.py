"""The aggregated-API mode without a cluster: corral's listener (``api_server``, as ``corral api``
configures it) with a request-header CA, and clients presenting what a Kubernetes aggregator presents,
a client certificate that CA signed plus ``X-Remote-User``/``X-Remote-Group``. Those reach the
Kubernetes routes as the tenant (or admin) the groups map to; the same headers without the
certificate, from a certificate of another CA, or of a name not allowed, buy nothing."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.api.app import create_app
from corral.api.server import api_server
from corral.core.frontproxy import FrontProxyPolicy
from corral.core.listen import ListenBounds
from corral.tls import CERT
from tests.security.test_slow_clients import serving

from .certs import Authority
from .conftest import ADMIN, Cluster

SANDBOXES = "/apis/agents.x-k8s.io/v1beta1"
PROXY_NAME = "front-proxy-client"


@dataclass
class Proxied:
    url: str
    server_ca: str
    trusted: Authority  # the request-header CA corral is given
    rogue: Authority  # one it is not
    certs: Path
    tokens: dict[str, str]

    def client(self, cert: tuple[str, str] | None = None, token: str | None = None) -> httpx.AsyncClient:
        ctx = ssl.create_default_context(cafile=self.server_ca)
        if cert is not None:
            ctx.load_cert_chain(*cert)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.AsyncClient(base_url=self.url, verify=ctx, headers=headers, timeout=30)

    def proxy_client(self, cn: str = PROXY_NAME, authority: Authority | None = None) -> httpx.AsyncClient:
        return self.client((authority or self.trusted).client(self.certs, cn))


def as_user(user: str, *groups: str) -> list[tuple[str, str]]:
    """The headers the aggregator adds: one X-Remote-Group per group, as Kubernetes sends them."""
    return [("X-Remote-User", user), *(("X-Remote-Group", g) for g in groups)]


async def names(r: httpx.Response) -> set[str]:
    assert r.status_code == 200, r.text
    return {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in r.json()["items"]}


@pytest.fixture
async def proxied(cluster: Cluster, tmp_path: Path) -> AsyncIterator[Proxied]:
    certs = tmp_path / "certs"
    trusted, rogue = Authority.make(certs, "front-proxy-ca"), Authority.make(certs, "rogue-ca")
    tokens = {}
    for tenant in ("acme", "umbrella"):
        r = await cluster.http.post("/v1/tenants", json={"name": tenant}, headers=cluster.as_(ADMIN))
        tokens[tenant] = r.json()["token"]
        made = await cluster.http.post(
            f"{SANDBOXES}/namespaces/{tenant}/sandboxes",
            json={"metadata": {"name": f"{tenant}-box"}, "spec": {"memoryMB": 256}},
            headers=cluster.as_(tokens[tenant]),
        )
        assert made.status_code == 201, made.text
    app = create_app(cluster.plane, manage=False, front_proxy=FrontProxyPolicy(frozenset({PROXY_NAME})))
    server = api_server(app, "127.0.0.1", 0, ListenBounds(), tls_dir=tmp_path / "tls", client_ca=trusted.path)
    async with serving(server) as port:
        yield Proxied(
            f"https://127.0.0.1:{port}", str(tmp_path / "tls" / CERT), trusted, rogue, certs, tokens
        )


async def test_the_aggregators_certificate_speaks_for_the_mapped_tenant(proxied: Proxied) -> None:
    async with proxied.proxy_client() as c:
        alice = as_user("alice", "corral:tenant:acme", "system:authenticated")
        r = await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=alice)
        assert await names(r) == {("acme", "acme-box")}
        # A write lands in the mapped tenant's namespace.
        made = await c.post(
            f"{SANDBOXES}/namespaces/acme/sandboxes",
            json={"metadata": {"name": "from-kube"}, "spec": {"memoryMB": 256}},
            headers=alice,
        )
        assert made.status_code == 201, made.text
        # A service account is the tenant its namespace names.
        robot = as_user(
            "system:serviceaccount:acme:builder", "system:serviceaccounts", "system:serviceaccounts:acme"
        )
        r = await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=robot)
        assert await names(r) == {("acme", "acme-box"), ("acme", "from-kube")}
        # The aggregator's own discovery calls come as system:masters: corral's admin.
        masters = as_user("system:kube-aggregator", "system:masters")
        assert (await c.get(f"{SANDBOXES}", headers=masters)).status_code == 200
        every = await names(await c.get(f"{SANDBOXES}/sandboxes", headers=masters))
        assert {("acme", "acme-box"), ("umbrella", "umbrella-box")} <= every


async def test_a_mapped_tenant_cannot_see_another_namespace(proxied: Proxied) -> None:
    async with proxied.proxy_client() as c:
        alice = as_user("alice", "corral:tenant:acme")
        for path in ("/namespaces/umbrella/sandboxes", "/namespaces/umbrella/sandboxes/umbrella-box"):
            r = await c.get(SANDBOXES + path, headers=alice)
            assert r.status_code == 403 and r.json()["reason"] == "Forbidden", r.text
        denied = await c.delete(f"{SANDBOXES}/namespaces/umbrella/sandboxes/umbrella-box", headers=alice)
        assert denied.status_code == 403
        # All namespaces: its own only.
        assert await names(await c.get(f"{SANDBOXES}/sandboxes", headers=alice)) == {("acme", "acme-box")}
        # Groups naming two tenants, a tenant corral does not have, or none: refused, never a guess.
        for headers in (
            as_user("mallory", "corral:tenant:acme", "corral:tenant:umbrella"),
            as_user("mallory", "corral:tenant:nosuch"),
            as_user("mallory", "system:authenticated"),
        ):
            r = await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=headers)
            assert r.status_code == 403, r.text


async def test_the_headers_without_the_certificate_are_ignored(proxied: Proxied) -> None:
    masters = as_user("admin", "system:masters")
    async with proxied.client() as c:
        r = await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=masters)
        assert r.status_code == 401 and r.json()["kind"] == "Status", r.text
    # With a tenant's token, the token speaks: the headers claim nothing more.
    async with proxied.client(token=proxied.tokens["umbrella"]) as c:
        r = await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=masters)
        assert r.status_code == 403, r.text
        mine = await c.get(f"{SANDBOXES}/sandboxes", headers=masters)
        assert await names(mine) == {("umbrella", "umbrella-box")}


async def test_a_certificate_of_a_name_not_allowed_is_ignored(proxied: Proxied) -> None:
    # Signed by the request-header CA, but not the front proxy's name: a client, not the proxy.
    async with proxied.proxy_client(cn="someone-else") as c:
        r = await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=as_user("x", "system:masters"))
        assert r.status_code == 401, r.text


async def test_a_certificate_from_another_ca_is_refused_in_the_handshake(proxied: Proxied) -> None:
    async with proxied.proxy_client(authority=proxied.rogue) as c:
        with pytest.raises(httpx.TransportError):
            await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes", headers=as_user("x", "system:masters"))
    # The listener serves on: others are unaffected.
    async with proxied.client(token=proxied.tokens["acme"]) as c:
        assert await names(await c.get(f"{SANDBOXES}/namespaces/acme/sandboxes")) == {("acme", "acme-box")}
