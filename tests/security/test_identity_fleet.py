"""Host identity and token lifecycle against real processes: two ``corral api`` replicas on one
PostgreSQL and two ``corral agent`` hosts, each enrolled with its own credentials."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.agent.credentials import HostCredentials
from tests.e2e.procs import Proc, api_args, enrol, free_port, start, wait_for, wait_ready
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ADMIN = "identity-admin-token-0123456789"
HOSTS = ("host-a", "host-b")


@dataclass
class Fleet:
    store: str
    logdir: Path
    replicas: list[Proc]
    agents: dict[str, Proc]
    agent_urls: dict[str, str]
    creds: dict[str, HostCredentials]

    def url(self, i: int) -> str:
        return self.replicas[i].url


def as_(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def start_replica(store: str, logdir: Path, i: int, admin: str) -> Proc:
    port = free_port()
    proc = start(
        f"replica-{i}-{port}",
        api_args(store, port, f"r{i}"),
        logdir,
        {"CORRAL_TOKEN": admin},
    )
    wait_ready(proc, f"http://127.0.0.1:{port}", timeout=60)
    return proc


def eventually(cond: Callable[[], bool], what: str, timeout: float = 15) -> None:
    wait_for(cond, timeout, what)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    base = require_pg()
    schema = new_schema_name("corral_identity")
    store = with_schema(base, schema)
    logdir = tmp_path_factory.mktemp("identity")
    replicas: list[Proc] = []
    agents: dict[str, Proc] = {}
    try:
        replicas = [start_replica(store, logdir, i, ADMIN) for i in range(2)]
        urls, creds = {}, {}
        for host in HOSTS:
            path, creds[host] = enrol(replicas[0].url, ADMIN, host, logdir)
            port = free_port()
            agents[host] = start(
                host,
                [
                    "agent",
                    "--control-plane",
                    ",".join(r.url for r in replicas),
                    "--token-file",
                    str(path),
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--memory-mb",
                    "8192",
                    "--heartbeat-interval",
                    "0.3",
                ],
                logdir,
            )
            urls[host] = f"http://127.0.0.1:{port}"
        f = Fleet(store, logdir, replicas, agents, urls, creds)
        eventually(lambda: len(_fresh(f, 0)) == len(HOSTS), "both hosts heartbeating", 60)
        yield f
    finally:
        for p in [*replicas, *agents.values()]:
            p.stop()
        drop_schema(base, schema)


def _fresh(f: Fleet, replica: int, token: str = ADMIN) -> set[str]:
    r = httpx.get(f"{f.url(replica)}/v1/hosts", headers=as_(token), timeout=10)
    r.raise_for_status()
    return {
        h["id"] for h in r.json()["hosts"] if h["heartbeat_age_s"] is not None and h["heartbeat_age_s"] < 3
    }


def _heartbeat(f: Fleet, replica: int, token: str, host: str, **changes: Any) -> httpx.Response:
    body = {
        "agent_id": host,
        "seq": time.time_ns() // 1000,
        "address": f.agent_urls.get(host, "http://127.0.0.1:9"),
        "sent_at": time.time(),
        "cpu_total": 4,
        "cpu_used": 0,
        "memory_mb_total": 8192,
        "memory_mb_used": 0,
        "memory_admission": "working-set",
        "memory_mb_admittable": 6144,
        "runtime": "sim",
        **changes,
    }
    return httpx.post(f"{f.url(replica)}/v1/agent/heartbeat", json=body, headers=as_(token), timeout=10)


def test_an_agent_token_heartbeats_only_for_its_own_host(fleet: Fleet) -> None:
    a = fleet.creds["host-a"]
    # Host A's token cannot speak for host B: not its address, not a lock-out by seq.
    r = _heartbeat(fleet, 0, a.agent_token, "host-b", address="http://127.0.0.1:1", seq=2**63 - 1)
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text
    r = _heartbeat(fleet, 1, a.agent_token, "host-new")
    assert r.status_code == 403, r.text
    with httpx.Client(base_url=fleet.url(0), headers=as_(ADMIN)) as c:
        hosts = {h["id"]: h for h in c.get("/v1/hosts").json()["hosts"]}
    assert hosts["host-b"]["address"] == fleet.agent_urls["host-b"] and "host-new" not in hosts
    # Nor can an agent token do anything but heartbeat.
    r = httpx.get(f"{fleet.url(0)}/v1/sandboxes", headers=as_(a.agent_token))
    assert r.status_code == 403


def test_the_admin_token_cannot_heartbeat(fleet: Fleet) -> None:
    for replica in (0, 1):
        r = _heartbeat(fleet, replica, ADMIN, "host-a", address="http://127.0.0.1:1")
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", r.text


def test_an_agent_refuses_calls_without_its_host_key(fleet: Fleet) -> None:
    url = fleet.agent_urls["host-a"]
    a, b = fleet.creds["host-a"], fleet.creds["host-b"]
    for headers in ({}, as_(ADMIN), as_(a.agent_token), as_(b.host_key), as_(a.host_key + "x")):
        r = httpx.get(f"{url}/v1/sandboxes", headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.text)
        r = httpx.post(f"{url}/v1/sandboxes", json={"id": "sb-x", "memory_mb": 64}, headers=headers)
        assert r.status_code == 401, (headers, r.text)
    assert httpx.get(f"{url}/v1/sandboxes", headers=as_(a.host_key), timeout=10).status_code == 200
    # The control plane holds each key: creates through either replica land and run.
    with httpx.Client(base_url=fleet.url(1), headers=as_(ADMIN), timeout=30) as c:
        # One create on each host: the first lands where spread sends it, then that host is drained
        # so the next must go to the other (spread alone can favour one host for a while when the
        # hosts' CPU readings differ on a loaded machine).
        made = [c.post("/v1/sandboxes", json={"memory_mb": 64})]
        assert made[0].status_code == 201, made[0].text
        first = made[0].json()["host_id"]
        assert c.post(f"/v1/hosts/{first}/drain").status_code == 200
        r = c.post("/v1/sandboxes", json={"memory_mb": 64}, headers={"Idempotency-Key": "second"})
        for _ in range(20):  # a refusal while the replica's view still offers the drained host
            if r.status_code == 201:
                break
            assert r.status_code == 503, r.text
            time.sleep(float(r.headers.get("Retry-After", "0.5")))
            r = c.post("/v1/sandboxes", json={"memory_mb": 64}, headers={"Idempotency-Key": "second"})
        assert r.status_code == 201, r.text
        made.append(r)
        assert c.post(f"/v1/hosts/{first}/undrain").status_code == 200
        assert {r.json()["host_id"] for r in made} == set(HOSTS)
        for r in made:
            ex = c.post(f"/v1/sandboxes/{r.json()['id']}/exec", json={"command": ["echo", "hi"]})
            assert ex.status_code == 200 and ex.json()["stdout"] == "hi\n", ex.text
        # a host with live sandboxes cannot be forgotten
        busy = made[0].json()["host_id"]
        r = c.delete(f"/v1/hosts/{busy}")
        assert r.status_code == 409 and r.json()["error"]["code"] == "host_has_sandboxes", r.text
        for r in made:
            assert c.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204


def test_reenrolment_rotates_and_forgetting_revokes(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.url(0), headers=as_(ADMIN), timeout=30) as c:
        first = HostCredentials.model_validate(c.post("/v1/hosts/host-z/token").json())
        assert _heartbeat(fleet, 1, first.agent_token, "host-z").status_code == 200
        second = HostCredentials.model_validate(c.post("/v1/hosts/host-z/token").json())
        assert {second.agent_token, second.host_key}.isdisjoint({first.agent_token, first.host_key})
        # The old token is refused on every replica (the other one within its revocation poll).
        for replica in (0, 1):
            eventually(
                lambda r=replica: _heartbeat(fleet, r, first.agent_token, "host-z").status_code == 401,
                f"the old agent token refused on replica {replica}",
            )
        # The new identity starts its sequence over, so a smaller seq than before is accepted.
        assert _heartbeat(fleet, 1, second.agent_token, "host-z", seq=1).status_code == 200
        assert c.delete("/v1/hosts/host-z").status_code == 204
        assert "host-z" not in {h["id"] for h in c.get("/v1/hosts").json()["hosts"]}
        assert c.delete("/v1/hosts/host-z").status_code == 404
        for replica in (0, 1):
            eventually(
                lambda r=replica: _heartbeat(fleet, r, second.agent_token, "host-z").status_code == 401,
                f"a forgotten host's token refused on replica {replica}",
            )


def test_a_revoked_tenant_token_is_refused_on_every_replica(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.url(0), headers=as_(ADMIN), timeout=30) as c:
        tenant = c.post("/v1/tenants", json={"name": "acme"}).json()
        old = tenant["token"]
        # Both replicas know (and cache) the token.
        for replica in (0, 1):
            assert httpx.get(f"{fleet.url(replica)}/v1/sandboxes", headers=as_(old)).status_code == 200
        # Rotate: a second token for the tenant, then the first one revoked.
        new = c.post("/v1/tenants/acme/tokens").json()
        assert new["tenant"] == tenant["id"] and new["role"] == "tenant"
        old_id = next(
            t["id"]
            for t in c.get("/v1/tokens").json()["tokens"]
            if t["id"] != new["id"] and t["tenant"] == tenant["id"]
        )
        assert c.delete(f"/v1/tokens/{old_id}").status_code == 204
        assert c.delete(f"/v1/tokens/{old_id}").status_code == 404
    for replica in (0, 1):
        eventually(
            lambda r=replica: httpx.get(f"{fleet.url(r)}/v1/sandboxes", headers=as_(old)).status_code == 401,
            f"the revoked tenant token refused on replica {replica}",
        )
        assert httpx.get(f"{fleet.url(replica)}/v1/sandboxes", headers=as_(new["token"])).status_code == 200


def test_rotated_admin_tokens_keep_replicas_working(fleet: Fleet) -> None:
    issued = httpx.post(f"{fleet.url(0)}/v1/tokens/admin", headers=as_(ADMIN), timeout=30).json()
    new = issued["token"]
    # A rolling restart: replica 1 comes back configured with the new token; the old one still works
    # everywhere until an operator revokes it.
    fleet.replicas[1].stop()
    fleet.replicas[1] = start_replica(fleet.store, fleet.logdir, 1, new)
    for replica in (0, 1):
        for token in (ADMIN, new):
            assert httpx.get(f"{fleet.url(replica)}/v1/hosts", headers=as_(token)).status_code == 200
    # An admin token cannot revoke itself (an operator would lock themselves out mid-rotation).
    me = httpx.delete(f"{fleet.url(0)}/v1/tokens/{issued['id']}", headers=as_(new))
    assert me.status_code == 403, me.text
    tokens = httpx.get(f"{fleet.url(1)}/v1/tokens", headers=as_(new)).json()["tokens"]
    old_ids = [t["id"] for t in tokens if t["role"] == "admin" and t["id"] != issued["id"]]
    for token_id in old_ids:
        assert httpx.delete(f"{fleet.url(1)}/v1/tokens/{token_id}", headers=as_(new)).status_code == 204
    for replica in (0, 1):
        eventually(
            lambda r=replica: httpx.get(f"{fleet.url(r)}/v1/hosts", headers=as_(ADMIN)).status_code == 401,
            f"the old admin token refused on replica {replica}",
        )
        # and the replicas, and the agents through them, carry on
        eventually(lambda r=replica: _fresh(fleet, r, new) == set(HOSTS), "both hosts fresh")
    # A replica restarted with the stale configuration does not bring the revoked token back.
    stale = start(
        "replica-stale", api_args(fleet.store, free_port(), "r-stale"), fleet.logdir, {"CORRAL_TOKEN": ADMIN}
    )
    assert stale.popen.wait(60) != 0
    assert "revoked" in stale.output()
    r = httpx.post(f"{fleet.url(0)}/v1/sandboxes", json={"memory_mb": 64}, headers=as_(new), timeout=30)
    assert r.status_code == 201, r.text
    assert httpx.delete(f"{fleet.url(1)}/v1/sandboxes/{r.json()['id']}", headers=as_(new)).status_code == 204
