"""Failover with real processes: ``corral api`` replicas on PostgreSQL and four process-runtime agents,
each with its own state directory. An agent is killed with SIGKILL (its sandboxes keep running, as when
an agent crashes) or cut off by a proxy (alive, its heartbeats dropped); past dead_after its
recreate-policy sandboxes run on other hosts under their ids and its orphan-policy ones answer 410;
when it comes back, its copies of the recreated ones are stopped by its first heartbeat's reply and
its orphans are reclaimed. Sampled throughout: no id is ever routable to two hosts. A secret given at
create travels to the new host and appears in no response, no log line and no PostgreSQL dump."""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from corral.runtime.process import unavailable_reason
from corral.testing import CuttableProxy
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

from .procs import Proc, api_args, enrol, free_port, start, wait_for, wait_ready

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.slow]

ADMIN = "failover-admin-token-0123456789"
CANARY = "canary-7c2f9d1e-secret"
SEAL_KEY = base64.urlsafe_b64encode(bytes(range(32))).decode()
# Trials of the cut-off test: one in the suite, more with ``make fence-trials``.
FENCE_TRIALS = int(os.environ.get("CORRAL_FENCE_TRIALS", "1"))
TIMING = ["--stale-after", "1.5", "--dead-after", "3", "--reconcile-interval", "0.3", "--lease-s", "2"]


@dataclass
class Fleet:
    tmp: Path
    store: str
    replicas: list[Proc]
    agents: dict[str, Proc] = field(default_factory=dict)
    agent_urls: dict[str, str] = field(default_factory=dict)
    host_keys: dict[str, str] = field(default_factory=dict)
    creds: dict[str, Path] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    proxies: dict[str, list[CuttableProxy]] = field(default_factory=dict)

    def admin(self) -> httpx.Client:
        live = next(r for r in self.replicas if r.alive())
        return httpx.Client(base_url=live.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30)

    def start_agent(self, host_id: str) -> None:
        port = self.ports.setdefault(host_id, free_port())
        # Every replica, each through a proxy the test can cut: cutting them all silences this host
        # only, and a dead replica silences nobody.
        proxies = self.proxies.get(host_id)
        if proxies is None:
            proxies = self.proxies[host_id] = [
                CuttableProxy(("127.0.0.1", int(r.url.rsplit(":", 1)[1]))) for r in self.replicas
            ]
            for p in proxies:
                p.up()
        urls = ",".join(f"http://127.0.0.1:{p.port}" for p in proxies)
        self.agents[host_id] = start(
            f"{host_id}-{len(self.agents)}-{time.monotonic_ns()}",
            [
                "agent",
                "--control-plane",
                urls,
                "--token-file",
                str(self.creds[host_id]),
                "--runtime",
                "process",
                "--state-dir",
                str(self.tmp / "state" / host_id),
                "--memory-mb",
                "4096",
                "--headroom-mb",
                "512",
                "--listen",
                f"127.0.0.1:{port}",
                "--heartbeat-interval",
                "0.5",
            ],
            self.tmp,
        )
        self.agent_urls[host_id] = f"http://127.0.0.1:{port}"

    def cut(self, host_id: str) -> None:
        for p in self.proxies[host_id]:
            p.down()

    def heal(self, host_id: str) -> None:
        for p in self.proxies[host_id]:
            p.up()

    def listing(self, host_id: str) -> list[dict[str, Any]]:
        """What the agent runs, as it lists it (empty when it does not answer)."""
        try:
            r = httpx.get(
                self.agent_urls[host_id] + "/v1/sandboxes",
                headers={"Authorization": f"Bearer {self.host_keys[host_id]}"},
                timeout=5,
            )
        except httpx.HTTPError:
            return []
        out: list[dict[str, Any]] = r.json() if r.status_code == 200 else []
        return out

    def on_agent(self, host_id: str) -> dict[str, int]:
        """Sandbox id -> epoch of what the agent runs (empty when it does not answer)."""
        return {s["id"]: s["epoch"] for s in self.listing(host_id)}

    def frozen_on(self, host_id: str) -> set[str]:
        """What the agent runs frozen (its run lease lapsed, or paused)."""
        return {s["id"] for s in self.listing(host_id) if s.get("paused")}

    def stop(self) -> None:
        for p in [*self.agents.values(), *self.replicas]:
            p.stop()
        for proxies in self.proxies.values():
            for p in proxies:
                p.down()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    reason = unavailable_reason()
    assert reason is None, f"the process runtime must work here: {reason}"
    base = require_pg()
    schema = new_schema_name("corral_failover")
    store = with_schema(base, schema)
    env = {"CORRAL_TOKEN": ADMIN, "CORRAL_SEAL_KEY": SEAL_KEY}
    reps = []
    for i in range(2):
        port = free_port()
        reps.append(start(f"replica-{i}", api_args(store, port, f"r{i}", *TIMING), tmp_path, env))
        reps[-1].url = f"http://127.0.0.1:{port}"
    f = Fleet(tmp_path, store, reps)
    try:
        for r in reps:
            wait_ready(r, r.url, timeout=60)
        for i in range(4):
            host_id = f"host-{i + 1}"
            f.creds[host_id], creds = enrol(reps[0].url, ADMIN, host_id, tmp_path)
            f.host_keys[host_id] = creds.host_key
            f.start_agent(host_id)
        wait_for(lambda: len(fresh_hosts(f)) == 4, 60, "four agents heartbeating")
        yield f
    finally:
        f.stop()
        drop_schema(base, schema)


def fresh_hosts(f: Fleet) -> list[str]:
    with f.admin() as c:
        return [
            h["id"]
            for h in c.get("/v1/hosts").json()["hosts"]
            if h["heartbeat_age_s"] is not None and h["heartbeat_age_s"] < 1.5
        ]


def records(f: Fleet) -> dict[str, dict[str, Any]]:
    with f.admin() as c:
        return {s["id"]: s for s in c.get("/v1/sandboxes", params={"limit": 1000}).json()["sandboxes"]}


def place_on_one_host(f: Fleet) -> tuple[str, list[str], list[str]]:
    """Three recreate-policy and two orphan-policy sandboxes on one host (others deleted)."""
    body = {"memory_mb": 128, "env": {"PLAIN": "p"}, "secrets": {"TOKEN": CANARY}}
    made: dict[str, list[tuple[str, str]]] = {}
    with f.admin() as c:
        while True:
            policy = "recreate" if sum(len(v) for v in made.values()) % 2 == 0 else "orphan"
            r = c.post("/v1/sandboxes", json={**body, "failover": policy})
            assert r.status_code == 201, r.text
            assert CANARY not in r.text
            made.setdefault(r.json()["host_id"], []).append((r.json()["id"], policy))
            for host, group in made.items():
                rec = [i for i, p in group if p == "recreate"]
                orph = [i for i, p in group if p == "orphan"]
                if len(rec) >= 3 and len(orph) >= 2:
                    keep = set(rec[:3] + orph[:2])
                    for g in made.values():
                        for i, _ in g:
                            if i not in keep:
                                assert c.delete(f"/v1/sandboxes/{i}").status_code == 204
                    return host, rec[:3], orph[:2]


class Sampler:
    """Watches, every 50 ms, which hosts would answer a call for each id: a call goes to the record's
    host with the record's epoch, and an agent answers only for a copy of that epoch. Counts every
    moment where two hosts hold a copy at the routed epoch, or the routed host holds another one."""

    def __init__(self, f: Fleet, ids: list[str]) -> None:
        self.f, self.ids = f, ids
        self.doubles: list[tuple[str, set[str]]] = []
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.mark()
        self._stop.set()
        self._thread.join(10)

    def mark(self) -> None:
        """Wait for a sample taken after this moment: each phase of a scenario is watched at least
        once, however slowly the machine samples."""
        seen = self.samples
        deadline = time.monotonic() + 30
        while self.samples < seen + 2 and time.monotonic() < deadline and self._thread.is_alive():
            time.sleep(0.01)
        assert self.samples >= seen + 2, "the sampler stalled"

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                recs = records(self.f)
            except httpx.HTTPError:
                continue
            copies = {h: self.f.on_agent(h) for h in self.f.agent_urls}
            for sid in self.ids:
                rec = recs.get(sid)
                if rec is None:
                    continue
                at_epoch = {h for h, held in copies.items() if held.get(sid) == rec["epoch"]}
                if len(at_epoch) > 1:
                    self.doubles.append((sid, at_epoch))
            self.samples += 1
            self._stop.wait(0.05)


def exec_env(f: Fleet, sid: str) -> httpx.Response:
    with f.admin() as c:
        return c.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["env"]})


def pg_dump(f: Fleet) -> bytes:
    base, _, schema = f.store.partition("?schema=")
    return subprocess.run(["pg_dump", "--schema", schema, base], capture_output=True, check=True).stdout


def leader(f: Fleet) -> str:
    base, _, schema = f.store.partition("?schema=")
    with psycopg.connect(base) as conn:
        row = conn.execute(
            f'SELECT holder FROM "{schema}".leases WHERE name = %s', ("reconciler",)
        ).fetchone()
    return str(row[0]) if row else ""


def stale_copy_refuses(f: Fleet, host: str, sid: str, epoch: int) -> bool:
    r = httpx.post(
        f.agent_urls[host] + f"/v1/sandboxes/{sid}/exec",
        json={"command": ["true"]},
        headers={"Authorization": f"Bearer {f.host_keys[host]}", "X-Corral-Epoch": str(epoch)},
        timeout=10,
    )
    return r.status_code == 409 and r.json()["error"]["code"] == "stale_epoch"


def test_kill_9_of_an_agent_and_of_the_leader_mid_failover(fleet: Fleet) -> None:
    f = fleet
    dead, recreate, orphan = place_on_one_host(f)
    with Sampler(f, recreate + orphan) as sampler:
        f.agents[dead].kill9()
        killed_at = time.monotonic()
        # The leader dies as the failover begins: the other replica must finish it.
        wait_for(
            lambda: any(records(f)[i]["state"] != "running" for i in recreate + orphan),
            60,
            "failover to begin",
        )
        who = leader(f)
        assert who in ("r0", "r1")
        f.replicas[int(who[1])].kill9()
        wait_for(
            lambda: all(records(f)[i]["state"] == "running" for i in recreate),
            60,
            "every recreate sandbox running",
        )
        took = time.monotonic() - killed_at
        sampler.mark()
        recs = records(f)
        for sid in recreate:
            assert recs[sid]["host_id"] != dead and recs[sid]["epoch"] >= 1 and recs[sid]["recreated_at"]
            r = exec_env(f, sid)
            assert r.status_code == 200 and f"TOKEN={CANARY}" in r.json()["stdout"], r.text
            assert "PLAIN=p" in r.json()["stdout"]
        for sid in orphan:
            assert recs[sid]["state"] == "orphaned"
            assert exec_env(f, sid).status_code == 410
        # The agent comes back with its old copies (their processes kept running): the recreated
        # ones are stopped at once, the orphans reclaimed.
        f.start_agent(dead)
        sampler.mark()
        wait_for(lambda: not set(recreate) & set(f.on_agent(dead)), 60, "the stale copies to stop")
        wait_for(lambda: all(records(f)[i]["state"] == "running" for i in orphan), 60, "orphans reclaimed")
        assert set(orphan) <= set(f.on_agent(dead))
        # The restarted agent had no secret on its disk: the control plane sent the orphans' again.
        for sid in orphan:
            r = exec_env(f, sid)
            assert r.status_code == 200 and f"TOKEN={CANARY}" in r.json()["stdout"], r.text
    assert sampler.doubles == []
    # Nothing lost: every sandbox is running, each on exactly one host.
    recs = records(f)
    everywhere: dict[str, list[str]] = {}
    for host in f.agent_urls:
        for sid in f.on_agent(host):
            everywhere.setdefault(sid, []).append(host)
    for sid in recreate + orphan:
        assert recs[sid]["state"] == "running"
        assert everywhere[sid] == [recs[sid]["host_id"]], (sid, everywhere.get(sid))
    # The canary is nowhere it must not be.
    assert CANARY.encode() not in pg_dump(f)
    for log in f.tmp.glob("*.log"):
        assert CANARY not in log.read_text(errors="replace"), log
    for state in (f.tmp / "state").rglob("*"):
        if state.is_file():
            assert CANARY.encode() not in state.read_bytes(), state
    with f.admin() as c:
        assert CANARY not in c.get("/v1/sandboxes", params={"limit": 1000}).text
    print(f"failover: all recreate sandboxes running {took:.2f}s after kill -9 (dead_after 3 s)")


@pytest.mark.parametrize("trial", range(FENCE_TRIALS))
def test_an_agent_cut_off_then_healed_is_fenced(fleet: Fleet, trial: int) -> None:
    f = fleet
    cut, recreate, orphan = place_on_one_host(f)
    with Sampler(f, recreate + orphan) as sampler:
        f.cut(cut)  # its heartbeats go nowhere; it keeps running, and keeps its sandboxes
        cut_at = time.monotonic()
        # Its run lease lapses before dead_after: its recreate-policy copies freeze, its orphans run on.
        wait_for(lambda: set(recreate) <= f.frozen_on(cut), 10, "the cut-off host to freeze its copies")
        assert all(records(f)[i]["epoch"] == 0 for i in recreate), "frozen only after they moved"
        assert not set(orphan) & f.frozen_on(cut)
        wait_for(
            lambda: all(
                records(f)[i]["state"] == "running" and records(f)[i]["epoch"] == 1 for i in recreate
            ),
            60,
            "every recreate sandbox recreated elsewhere",
        )
        took = time.monotonic() - cut_at
        sampler.mark()
        for sid in recreate:
            # The old copy is frozen, or stopped by the host itself at dead_after; one still there
            # refuses a call for the current epoch.
            assert sid not in f.on_agent(cut) or (
                sid in f.frozen_on(cut) and stale_copy_refuses(f, cut, sid, 1)
            )
        f.heal(cut)
        sampler.mark()
        wait_for(lambda: not set(recreate) & set(f.on_agent(cut)), 60, "the stale copies to stop")
        wait_for(lambda: all(records(f)[i]["state"] == "running" for i in orphan), 60, "orphans reclaimed")
    assert sampler.doubles == []
    print(f"failover: all recreate sandboxes running {took:.2f}s after the cut (dead_after 3 s)")


def test_a_replica_killed_while_creates_wait_loses_none(fleet: Fleet) -> None:
    f = fleet
    body = {"memory_mb": 1024, "stateful": True}
    filled = []
    with f.admin() as c:
        while True:
            r = c.post("/v1/sandboxes", json=body)
            if r.status_code != 201:
                assert r.status_code == 503, r.text
                break
            filled.append(r.json()["id"])
    doomed = f.replicas[1]

    def park(key: str) -> None:
        # Its client sees the replica die mid-wait; the retry below attaches on the other one.
        with contextlib.suppress(httpx.HTTPError):
            httpx.post(
                doomed.url + "/v1/sandboxes",
                json={**body, "wait_s": 120},
                headers={"Authorization": f"Bearer {ADMIN}", "Idempotency-Key": key},
                timeout=120,
            )

    keys = [f"wait-{i}" for i in range(3)]
    waiters = [threading.Thread(target=park, args=(k,), daemon=True) for k in keys]
    for t in waiters:
        t.start()

    def parked() -> list[dict[str, Any]]:
        return [s for s in records(f).values() if s["state"] == "waiting_capacity"]

    wait_for(lambda: len(parked()) == 3, 60, "three creates parked")
    doomed.kill9()
    for t in waiters:
        t.join(30)
    assert len(parked()) == 3  # the store keeps them: nothing died with the replica
    results: dict[str, httpx.Response] = {}

    def retry(key: str) -> None:
        results[key] = httpx.post(
            f.replicas[0].url + "/v1/sandboxes",
            json={**body, "wait_s": 120},
            headers={"Authorization": f"Bearer {ADMIN}", "Idempotency-Key": key},
            timeout=150,
        )

    retries = [threading.Thread(target=retry, args=(k,), daemon=True) for k in keys]
    for t in retries:
        t.start()
    time.sleep(0.5)
    assert len(parked()) == 3  # attached, none parked twice
    with f.admin() as c:
        for sid in filled[:3]:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    for t in retries:
        t.join(150)
    assert all(results[k].status_code == 201 for k in keys), {k: r.text for k, r in results.items()}
    ids = {results[k].json()["id"] for k in keys}
    assert len(ids) == 3 and not parked()
    recs = records(f)
    assert all(recs[i]["state"] == "running" for i in ids)
