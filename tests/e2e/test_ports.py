"""Sandboxes' ports through any replica: two ``corral api`` replicas on PostgreSQL (``--domain
sb.test``) and one ``corral agent`` running real sandboxes in network slots; a server started inside
a sandbox, reached through each replica (both forward to the agent) by Host and by path, kept alive,
over a WebSocket, with 100 MB bodies each way; the traffic token (none, wrong, right); a port with
nothing listening; a sandbox without an interface; the hop guard; custom domains bound twice and
raced from two replicas. Traffic stays on loopback and the slots' own addresses."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from corral.agent import netns
from corral.runtime.process import unavailable_reason
from corral.testing.portserver import start_argv
from tests.e2e.procs import Proc, process_fleet
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.process,
    pytest.mark.timeout(240),
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.tools_missing()), reason="slots need root, ip, nft"),
]

ADMIN = "ports-admin-token-0123456789abc"
DOMAIN = "sb.test"
PORT = 8080
MB100 = 100_000_000


@dataclass
class Fleet:
    replicas: list[Proc]
    key: str  # tenant alice's
    public: str  # a sandbox whose ports answer anyone
    private: str  # one whose ports need its traffic token
    token: str
    offline: str  # one without an interface (egress none)
    agent: str  # the agent's own address (what replicas forward to)

    def client(self, i: int) -> httpx.Client:
        return httpx.Client(base_url=self.replicas[i].url, timeout=60)

    def tenant(self, i: int) -> httpx.Client:
        return httpx.Client(
            base_url=self.replicas[i].url, headers={"Authorization": f"Bearer {self.key}"}, timeout=60
        )


def _e2b_create(url: str, key: str, network: dict[str, object]) -> dict[str, str]:
    body = {"templateID": "base", "timeout": 300, "allow_internet_access": False, "network": network}
    r = httpx.post(f"{url}/sandboxes", json=body, headers={"X-API-KEY": key}, timeout=60)
    assert r.status_code == 201, r.text
    got: dict[str, str] = r.json()
    return got


def _serve(tenant: httpx.Client, sandbox_id: str) -> None:
    r = tenant.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": start_argv(PORT), "timeout_s": 30})
    assert r.status_code == 200, r.text
    assert r.json()["stdout"].strip() == "listening", r.json()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    assert unavailable_reason() is None
    tmp: Path = tmp_path_factory.mktemp("ports")
    base = require_pg()
    schema = new_schema_name("corral_ports")
    try:
        with process_fleet(tmp, with_schema(base, schema), ADMIN, api_extra=["--domain", DOMAIN]) as (
            replicas,
            _agent,
        ):
            admin = {"Authorization": f"Bearer {ADMIN}"}
            r = httpx.post(f"{replicas[0].url}/v1/tenants", json={"name": "alice"}, headers=admin, timeout=30)
            assert r.status_code == 201, r.text
            key = r.json()["token"]
            public = _e2b_create(replicas[0].url, key, {})
            assert public["domain"] == DOMAIN and public["trafficAccessToken"] is None
            private = _e2b_create(replicas[0].url, key, {"allowPublicTraffic": False})
            assert private["trafficAccessToken"]
            with httpx.Client(base_url=replicas[0].url, headers={"Authorization": f"Bearer {key}"}) as t:
                offline = t.post("/v1/sandboxes", json={}, timeout=60)
                assert offline.status_code == 201, offline.text
                for made in (public, private):
                    _serve(t, made["sandboxID"])
            hosts = httpx.get(f"{replicas[0].url}/v1/hosts", headers=admin, timeout=30).json()["hosts"]
            yield Fleet(
                replicas,
                key,
                public["sandboxID"],
                private["sandboxID"],
                private["trafficAccessToken"],
                offline.json()["id"],
                hosts[0]["address"],
            )
    finally:
        drop_schema(base, schema)


def test_a_port_through_every_replica_by_host_and_by_path(fleet: Fleet) -> None:
    host = f"{PORT}-{fleet.public}.{DOMAIN}"
    for i in range(len(fleet.replicas)):
        with fleet.client(i) as c:
            for n in range(3):  # one kept-alive connection, several requests
                r = c.get(f"/hello/{n}?q=1", headers={"Host": host})
                assert r.status_code == 200, r.text
                assert r.text == f"hello /hello/{n}?q=1 {host}"
            r = c.get(f"/v1/sandboxes/{fleet.public}/ports/{PORT}/hello/path")
            assert r.status_code == 200, r.text
            assert r.text.startswith("hello /hello/path ")
            # The Host form with the replica's port after the domain, as a browser sends it.
            r = c.get("/hello/p", headers={"Host": f"{host}:{c.base_url.port}"})
            assert r.status_code == 200 and r.text.startswith("hello /hello/p "), r.text


def test_a_websocket_echoes_through_a_replica(fleet: Fleet) -> None:
    url = fleet.replicas[1].url.replace("http://", "ws://")
    with ws_connect(f"{url}/v1/sandboxes/{fleet.public}/ports/{PORT}/ws") as ws:
        for message in ("hello", b"\x00\x01binary", "x" * 70_000):
            ws.send(message)
            assert ws.recv() == message


def test_100_mb_streamed_each_way(fleet: Fleet) -> None:
    host = {"Host": f"{PORT}-{fleet.public}.{DOMAIN}"}
    with fleet.client(1) as c:
        digest, total = hashlib.sha256(), 0
        with c.stream("GET", f"/bytes?n={MB100}", headers=host) as r:
            assert r.status_code == 200
            for chunk in r.iter_raw():
                digest.update(chunk)
                total += len(chunk)
        assert total == MB100
        want = hashlib.sha256()
        block = bytes(range(256)) * 256
        for start in range(0, MB100, len(block)):
            want.update(block[: min(len(block), MB100 - start)])
        assert digest.hexdigest() == want.hexdigest()

        def body() -> Iterator[bytes]:
            sent = 0
            while sent < MB100:
                part = block[: min(len(block), MB100 - sent)]
                sent += len(part)
                yield part

        r = c.post("/count", content=body(), headers={**host, "Content-Length": str(MB100)})
        assert r.status_code == 200, r.text
        assert r.text == f"{MB100} {want.hexdigest()}"


def test_the_traffic_token_none_wrong_right(fleet: Fleet) -> None:
    host = f"{PORT}-{fleet.private}.{DOMAIN}"
    for i in range(len(fleet.replicas)):
        with fleet.client(i) as c:
            none = c.get("/hello", headers={"Host": host})
            wrong = c.get("/hello", headers={"Host": host, "e2b-traffic-access-token": "0" * 64})
            other = c.get("/hello", headers={"Host": host, "e2b-traffic-access-token": b"\xe9\xff"})
            right = c.get("/hello", headers={"Host": host, "e2b-traffic-access-token": fleet.token})
            assert (none.status_code, wrong.status_code, other.status_code, right.status_code) == (
                403,
                403,
                403,
                200,
            )
            assert none.json()["error"]["code"] == "traffic_token_invalid"
            assert right.text == f"hello /hello {host}"
            by_path = c.get(f"/v1/sandboxes/{fleet.private}/ports/{PORT}/hello")
            assert by_path.status_code == 403
    # A public sandbox's token does not open the private one (tokens are per sandbox).
    with fleet.client(0) as c:
        swapped = c.get(
            f"/v1/sandboxes/{fleet.public}/ports/{PORT}/hello",
            headers={"e2b-traffic-access-token": fleet.token},
        )
        assert swapped.status_code == 200  # public: any request, token or not


def test_refusals_say_why(fleet: Fleet) -> None:
    with fleet.client(1) as c:
        closed = c.get("/", headers={"Host": f"8081-{fleet.public}.{DOMAIN}"})
        assert closed.status_code == 502 and closed.json()["error"]["code"] == "port_closed", closed.text
        offline = c.get(f"/v1/sandboxes/{fleet.offline}/ports/{PORT}/")
        assert offline.status_code == 409 and offline.json()["error"]["code"] == "network_not_attached"
        missing = c.get("/", headers={"Host": f"{PORT}-sb-nope.{DOMAIN}"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        for bad in ("0", "65536", "http", "08080", "1" * 40):
            r = c.get(f"/v1/sandboxes/{fleet.public}/ports/{bad}/")
            assert r.status_code == 422, (bad, r.text)
        looped = c.get(f"/v1/sandboxes/{fleet.public}/ports/{PORT}/", headers={"corral-forwarded": "1"})
        assert looped.status_code == 421 and looped.json()["error"]["code"] == "misdirected"
        # A Host that is not one of the forms is the API's own request, answered by it.
        assert c.get("/readyz", headers={"Host": f"x-{fleet.public}.{DOMAIN}"}).status_code == 200


def test_the_agent_takes_a_port_request_only_with_its_host_key(fleet: Fleet) -> None:
    """Straight to the agent, past every replica: without the host key (none, a wrong one, a
    tenant's) a port request never reaches the sandbox, spliced or not."""
    with httpx.Client(base_url=fleet.agent, timeout=60) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {fleet.key}"}):
            r = c.get(f"/v1/sandboxes/{fleet.public}/ports/{PORT}/hello", headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", r.text


def test_a_custom_domain_is_bound_once_and_routed_like_a_port(fleet: Fleet) -> None:
    with fleet.tenant(0) as t0, fleet.tenant(1) as t1:
        bound = t0.post(
            f"/v1/sandboxes/{fleet.public}/domains", json={"hostname": "App.Example.TEST", "port": PORT}
        )
        assert bound.status_code == 201, bound.text
        assert bound.json() == {"hostname": "app.example.test", "sandbox_id": fleet.public, "port": PORT}
        twice = t1.post(
            f"/v1/sandboxes/{fleet.private}/domains", json={"hostname": "app.example.test", "port": 1}
        )
        assert twice.status_code == 409 and twice.json()["error"]["code"] == "domain_taken", twice.text
        for bad in ("localhost", "10.0.0.1", f"x.{DOMAIN}", "a..b", "-a.test", "a" * 300):
            r = t0.post(f"/v1/sandboxes/{fleet.public}/domains", json={"hostname": bad, "port": PORT})
            assert r.status_code == 422, (bad, r.text)
        with fleet.client(1) as c:
            r = c.get("/hello/custom", headers={"Host": "app.example.test"})
            assert r.status_code == 200 and r.text == "hello /hello/custom app.example.test", r.text

        async def race() -> list[int]:
            async with (
                httpx.AsyncClient(base_url=fleet.replicas[0].url, headers=t0.headers) as a,
                httpx.AsyncClient(base_url=fleet.replicas[1].url, headers=t1.headers) as b,
            ):
                got = await asyncio.gather(
                    a.post(
                        f"/v1/sandboxes/{fleet.public}/domains",
                        json={"hostname": "race.example.test", "port": 1},
                    ),
                    b.post(
                        f"/v1/sandboxes/{fleet.private}/domains",
                        json={"hostname": "race.example.test", "port": 1},
                    ),
                )
                return sorted(r.status_code for r in got)

        assert asyncio.run(race()) == [201, 409]
        listed = t1.get(f"/v1/sandboxes/{fleet.public}/domains").json()["domains"]
        assert "app.example.test" in [d["hostname"] for d in listed]
        assert t1.delete(f"/v1/sandboxes/{fleet.public}/domains/app.example.test").status_code == 204
        assert t1.delete(f"/v1/sandboxes/{fleet.public}/domains/app.example.test").status_code == 404
