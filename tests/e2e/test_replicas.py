"""Several ``corral api`` replicas on one PostgreSQL, with ``corral agent`` processes as hosts: the
consistency boundary under real concurrency, a replica killed mid-burst, and a store that goes away."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.testing import CuttableProxy
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

from .procs import Proc, api_args, enrol, free_port, start, wait_for, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ADMIN = "replicas-admin-token-0123456789"
HOST_MB = 8192  # (8192 - 2048 headroom) / 512 = 12 stateful 512 MiB sandboxes per host
PER_HOST = 12


@dataclass
class Fleet:
    replicas: list[Proc]
    agents: list[Proc]
    agent_urls: dict[str, str]
    host_keys: dict[str, str]

    def client(self, i: int) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.replicas[i].url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60
        )

    def admin(self, i: int = 0) -> httpx.Client:
        live = [r for r in self.replicas if r.alive()]
        return httpx.Client(base_url=live[i].url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)

    def agent_counts(self) -> dict[str, int]:
        out = {}
        for host, url in self.agent_urls.items():
            key = self.host_keys[host]
            r = httpx.get(url + "/v1/sandboxes", headers={"Authorization": f"Bearer {key}"}, timeout=10)
            r.raise_for_status()
            body = r.json()
            out[host] = len(body["sandboxes"] if isinstance(body, dict) else body)
        return out

    def stop(self) -> None:
        for p in [*self.replicas, *self.agents]:
            p.stop()


def launch(tmp_path: Path, store_url: str, replicas: int, hosts: int, bind_timeout: float = 10.0) -> Fleet:
    env = {"CORRAL_TOKEN": ADMIN}
    reps = []
    for i in range(replicas):
        port = free_port()
        reps.append(
            start(
                f"replica-{i}",
                api_args(
                    store_url,
                    port,
                    f"r{i}",
                    "--lease-s",
                    "3",
                    "--bind-timeout",
                    "2",
                    "--reconcile-interval",
                    "0.5",
                ),
                tmp_path,
                env,
            )
        )
        reps[-1].url = f"http://127.0.0.1:{port}"
    for r in reps:
        wait_ready(r, r.url, timeout=60)
    agents, urls, keys = [], {}, {}
    for i in range(hosts):
        port = free_port()
        host_id = f"host-{i + 1:02d}"
        creds_file, creds = enrol(reps[0].url, ADMIN, host_id, tmp_path)
        keys[host_id] = creds.host_key
        agents.append(
            start(
                host_id,
                [
                    # every replica, starting with a different one per host: a dead replica never
                    # silences a live host
                    "agent",
                    "--control-plane",
                    ",".join(r.url for r in reps[i % replicas :] + reps[: i % replicas]),
                    "--token-file",
                    str(creds_file),
                    "--runtime",
                    "sim",
                    "--memory-mb",
                    str(HOST_MB),
                    "--cpus",
                    "16",
                    "--listen",
                    f"127.0.0.1:{port}",
                    "--heartbeat-interval",
                    "0.5",
                ],
                tmp_path,
                env,
            )
        )
        urls[host_id] = f"http://127.0.0.1:{port}"
    fleet = Fleet(reps, agents, urls, keys)
    wait_for(lambda: len(fresh_hosts(fleet)) == hosts, 60, "every agent heartbeating")
    return fleet


def fresh_hosts(fleet: Fleet) -> list[dict]:  # type: ignore[type-arg]
    with fleet.admin() as c:
        return [
            h
            for h in c.get("/v1/hosts").json()["hosts"]
            if h["heartbeat_age_s"] is not None and h["heartbeat_age_s"] < 5
        ]


def reserved_total(fleet: Fleet) -> int:
    with fleet.admin() as c:
        return sum(h["reserved_mb"] for h in c.get("/v1/hosts").json()["hosts"])


@pytest.fixture
def pg_store() -> Iterator[str]:
    base = require_pg()
    schema = new_schema_name("corral_e2e")
    try:
        yield with_schema(base, schema)
    finally:
        drop_schema(base, schema)


async def burst(fleet: Fleet, n: int, body: dict, replicas: list[int]) -> list[httpx.Response]:  # type: ignore[type-arg]
    clients = [fleet.client(i) for i in replicas]
    try:
        return await asyncio.gather(
            *(clients[k % len(clients)].post("/v1/sandboxes", json=body) for k in range(n)),
            return_exceptions=False,
        )
    finally:
        for c in clients:
            await c.aclose()


def test_four_replicas_share_one_ledger(tmp_path: Path, pg_store: str) -> None:
    fleet = launch(tmp_path, pg_store, replicas=4, hosts=12)
    try:
        # A burst split across replicas spreads as one decider would (no 1/N-amplitude pile-up).
        rs = asyncio.run(burst(fleet, 50, {"memory_mb": 512}, [0, 1, 2, 3]))
        assert all(r.status_code == 201 for r in rs), [r.text for r in rs if r.status_code != 201][:3]
        per_host = Counter(r.json()["host_id"] for r in rs)
        # Four deciders at once, on a store they share: 4-5 per host, now and then a sixth (never the
        # half-burst a per-replica ledger piles up; see docs/simulation.md).
        assert max(per_host.values()) <= 6, per_host
        assert len(per_host) == 12, per_host
        with fleet.admin() as c:
            for r in rs:
                assert c.delete(f"/v1/sandboxes/{r.json()['id']}").status_code == 204
        wait_for(lambda: reserved_total(fleet) == 0, 20, "reservations of deleted sandboxes to end")

        # 200 concurrent creates for 144 places: never more on a host than its admittable allows.
        rs = asyncio.run(burst(fleet, 200, {"memory_mb": 512, "stateful": True}, [0, 1, 2, 3]))
        codes = Counter(r.status_code for r in rs)
        assert set(codes) <= {201, 503}, codes
        assert all(r.json()["error"]["code"] == "no_capacity" for r in rs if r.status_code == 503)
        assert all(int(r.headers["Retry-After"]) >= 1 for r in rs if r.status_code == 503)
        placed = codes[201]
        # The ledger refuses only when the fleet is full: filling what is left one by one lands
        # exactly the remaining room, no more and no less.
        with fleet.admin() as c:
            while (
                r := c.post("/v1/sandboxes", json={"memory_mb": 512, "stateful": True})
            ).status_code == 201:
                placed += 1
                assert placed <= 12 * PER_HOST, "over-admission"
            assert r.status_code == 503 and r.json()["error"]["code"] == "no_capacity"
        assert placed == 12 * PER_HOST
        counts = fleet.agent_counts()
        assert set(counts.values()) == {PER_HOST}, counts
        assert sum(counts.values()) == placed
        # and once heartbeats show the sandboxes, nothing is left reserved
        wait_for(lambda: reserved_total(fleet) == 0, 20, "reservations to be confirmed")
    finally:
        fleet.stop()


def test_kill_9_of_a_replica_mid_burst_leaks_nothing(tmp_path: Path, pg_store: str) -> None:
    # a short bind timeout: records a dead replica left half-made are settled sooner
    fleet = launch(tmp_path, pg_store, replicas=3, hosts=6, bind_timeout=2.0)
    try:

        async def go() -> list[httpx.Response | BaseException]:
            clients = [fleet.client(i) for i in range(3)]
            tasks = [
                asyncio.create_task(clients[k % 3].post("/v1/sandboxes", json={"memory_mb": 512}))
                for k in range(90)
            ]
            await asyncio.sleep(0.3)
            fleet.replicas[2].kill9()
            out = await asyncio.gather(*tasks, return_exceptions=True)
            for c in clients:
                await c.aclose()
            return out

        results = asyncio.run(go())
        assert not fleet.replicas[2].alive()
        ok = [r for r in results if isinstance(r, httpx.Response) and r.status_code == 201]
        assert ok, results[:3]

        def settled() -> bool:
            with fleet.admin() as c:
                hosts = c.get("/v1/hosts").json()["hosts"]
                reserved = c.get("/v1/sandboxes", params={"state": "reserved"}).json()["sandboxes"]
                running = {
                    s["id"] for s in c.get("/v1/sandboxes", params={"limit": 1000}).json()["sandboxes"]
                }
            on_agents = sum(fleet.agent_counts().values())
            last[:] = [sum(h["reserved_mb"] for h in hosts), len(reserved), on_agents, len(running)]
            return last[0] == 0 and not reserved and on_agents == len(running)

        last: list[int] = []

        # its reservations end with its lease; half-made creates are settled; strays are stopped
        try:
            wait_for(settled, 90, "the dead replica's work to be settled")
        except TimeoutError:
            raise AssertionError(f"reserved_mb, reserved records, on agents, records: {last}") from None
        with fleet.admin() as c:
            states = Counter(
                s["state"] for s in c.get("/v1/sandboxes", params={"limit": 1000}).json()["sandboxes"]
            )
        assert set(states) <= {"running"}, states
    finally:
        fleet.stop()


def test_store_unreachable_then_back(tmp_path: Path) -> None:
    base = require_pg()
    schema = new_schema_name("corral_e2e")
    target = httpx.URL(base)
    proxy = CuttableProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.up()
    via_proxy = with_schema(
        f"postgresql://{target.userinfo.decode() or 'postgres'}@127.0.0.1:{proxy.port}{target.path}", schema
    )
    fleet = launch(tmp_path, via_proxy, replicas=2, hosts=2)
    try:
        with fleet.admin() as c:
            sb = c.post("/v1/sandboxes", json={})
            assert sb.status_code == 201
            sid = sb.json()["id"]
            proxy.down()
            r = c.post("/v1/sandboxes", json={})
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable", r.text
            assert int(r.headers["Retry-After"]) >= 1
            # placement is CP; running sandboxes keep serving
            ex = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["echo", "still here"]})
            assert ex.status_code == 200 and ex.json()["stdout"] == "still here\n", ex.text
            assert c.get("/readyz").status_code == 503
            proxy.up()
            deadline = time.monotonic() + 30
            while (r := c.post("/v1/sandboxes", json={})).status_code != 201:
                assert time.monotonic() < deadline, r.text
                time.sleep(0.5)
    finally:
        fleet.stop()
        proxy.down()
        drop_schema(base, schema)
