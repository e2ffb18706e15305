"""Warm claims, each number beside its in-run comparison. JSON lines.

    .venv/bin/python bench/claim.py [--n 2000] [--start-latency-ms 20]

- agent_claim: the agent's hand-over (in process, and through its HTTP handler) beside a cold start
  through the same handler;
- api_create: a warm create through the control plane's HTTP API beside a cold create, on the sim
  runtime with no start latency and with the process runtime's measured start latency (bwrap 10-30 ms);
- pools_scale: warm create p50 with 100 pools and with 2,000 pools;
- burst: 100 concurrent warm creates on 12 hosts holding 10 warm each (hits, max claims on one host
  over the mean);
- process_first_exec: on the process runtime, through the SDK over real HTTP (``corral serve`` in a
  child process): a warm create then its first exec returning, beside a bare exec in an existing
  sandbox and a cold create then its first exec.

Everything else runs in one process over an ASGI transport (no sockets), a SQLite store in a temp dir.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.http import create_app as agent_app
from corral.agent.protocol import ClaimWarm, WarmTarget
from corral.api.app import create_app
from corral.clock import SystemClock
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.localfleet import build_local_fleet
from corral.control.plane import ControlPlane, build_replica
from corral.core import AdmissionMode, AdmissionPolicy, Timeouts
from corral.runtime.sim import SimRuntime
from corral.store import open_store

ADMIN = "bench-admin-token-0123456789"
AGENT = "bench-agent-token-0123456789"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p * len(s)))] * 1000, 4)


def emit(**row: Any) -> None:
    print(json.dumps(row), flush=True)


async def fill(agents: list[Agent], targets: list[WarmTarget]) -> None:
    for a in agents:
        a.set_warm_targets(targets)
        a.keeper.starts_per_round = 10_000
        a.keeper.max_in_flight = 10_000
        a.limiter.limit = 100_000
    while True:
        began = sum(a.replenish() for a in agents)
        await asyncio.sleep(0)
        if not began and not any(a.warm.starting_count(t.template) for a in agents for t in targets):
            return


async def agent_claim(n: int) -> None:
    agent = Agent(AgentConfig("bench", 1 << 30, 1 << 20, max_concurrent_starts=100_000), SimRuntime())
    await fill([agent], [WarmTarget(template="py", target=2 * n + 10, memory_mb=256)])
    direct = []
    for _ in range(n):
        t0 = time.perf_counter()
        agent.claim("py", ClaimWarm())
        direct.append(time.perf_counter() - t0)
    app = agent_app(agent, "tok")
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url="http://agent",
        headers={"Authorization": "Bearer tok"},
    )
    claims, cold = [], []
    for i in range(n):
        t0 = time.perf_counter()
        r = await http.post("/v1/warm/py/claim", json={"env": {"A": "1"}})
        claims.append(time.perf_counter() - t0)
        assert r.status_code == 200, r.text
        t0 = time.perf_counter()
        r = await http.post("/v1/sandboxes", json={"id": f"cold-{i}", "memory_mb": 256})
        cold.append(time.perf_counter() - t0)
        assert r.status_code == 201, r.text
    await http.aclose()
    emit(
        bench="agent_claim",
        n=n,
        in_process_p50_ms=pct(direct, 0.5),
        in_process_p99_ms=pct(direct, 0.99),
        handler_p50_ms=pct(claims, 0.5),
        handler_p99_ms=pct(claims, 0.99),
        cold_start_handler_p50_ms=pct(cold, 0.5),
        bar_p50_ms=0.5,
    )


class Fleet:
    def __init__(self, plane: ControlPlane, agents: list[Agent], http: httpx.AsyncClient) -> None:
        self.plane, self.agents, self.http = plane, agents, http

    async def beat(self) -> None:
        for a in self.agents:
            await a.beat()
        self.plane.view.invalidate()

    async def close(self) -> None:
        await self.http.aclose()
        await self.plane.stop()
        await self.plane.store.close()


async def fleet(root: Path, hosts: int, start_latency_s: float = 0.0) -> Fleet:
    store = open_store(f"sqlite:///{root / 'corral.db'}")
    policy = AdmissionPolicy(headroom_mb=1024)
    config = ControlConfig(
        replica_id="bench",
        timeouts=Timeouts(heartbeat_interval_s=2, stale_after_s=30, dead_after_s=60, view_ttl_s=1),
        policy=policy,
    )
    directory = LocalAgents()
    plane = build_replica(store, directory, config, SystemClock(), random.Random(1))
    local = build_local_fleet(
        plane,
        directory,
        hosts=hosts,
        runtime="sim",
        memory_mb=1 << 24,
        cpus=4096,
        admission=AdmissionMode.WORKING_SET,
        policy=policy,
        heartbeat_interval_s=2,
        max_concurrent_starts=10_000,
        seed=1,
    )
    for a in local.agents:
        assert isinstance(a.runtime, SimRuntime)
        a.runtime.start_latency_s = start_latency_s
    await plane.start(admin_token=ADMIN, agent_token=AGENT)
    if plane._task is not None:
        plane._task.cancel()
    http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(plane, manage=False)),
        base_url="http://corral",
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    f = Fleet(plane, local.agents, http)
    await f.beat()
    return f


async def make_pools(f: Fleet, templates: list[str], size: int) -> None:
    for t in templates:
        r = await f.http.post("/v1/templates", json={"name": t, "memory_mb": 256})
        assert r.status_code == 201, r.text
        await f.plane.store.create_pool(t, size=size)
    await f.plane.reconciler.tick()
    await f.beat()
    for a in f.agents:
        a.keeper.starts_per_round = 100_000
        a.keeper.max_in_flight = 100_000
    while True:
        began = sum(a.replenish() for a in f.agents)
        for _ in range(3):
            await asyncio.sleep(0)
        if not began and not any(a.warm.starting_count(t) for a in f.agents for t in a.warm.targets):
            break
    await f.beat()


async def timed_creates(f: Fleet, n: int, body: dict[str, Any]) -> tuple[list[float], int]:
    times, warm = [], 0
    for _ in range(n):
        t0 = time.perf_counter()
        r = await f.http.post("/v1/sandboxes", json=body)
        times.append(time.perf_counter() - t0)
        assert r.status_code == 201, r.text
        warm += bool(r.json()["warm"])
    return times, warm


async def api_create(n: int, start_latency_s: float) -> None:
    with tempfile.TemporaryDirectory() as d:
        f = await fleet(Path(d), hosts=4, start_latency_s=start_latency_s)
        try:
            await make_pools(f, ["py"], n + 20)
            await timed_creates(f, 20, {"template": "py"})  # warm-up
            warm, cold, hits = [], [], 0
            for _ in range(n):  # in turn, so drift in the machine's load hits both alike
                w, h = await timed_creates(f, 1, {"template": "py"})
                c, _ = await timed_creates(f, 1, {"template": "default"})
                warm += w
                cold += c
                hits += h
        finally:
            await f.close()
    emit(
        bench="api_create",
        runtime="sim",
        start_latency_ms=start_latency_s * 1000,
        n=n,
        warm_hits=hits,
        warm_p50_ms=pct(warm, 0.5),
        warm_p99_ms=pct(warm, 0.99),
        cold_p50_ms=pct(cold, 0.5),
        warm_over_cold=round(statistics.median(warm) / statistics.median(cold), 3),
        bars={"warm_p50_ms": 5, "warm_over_cold": 0.333},
    )


async def pools_scale(n: int) -> None:
    """Both fleets stand side by side and take creates in turn, so drift in the machine's load hits
    both alike."""
    counts = (100, 2000)
    with tempfile.TemporaryDirectory() as d:
        fleets, names = {}, {}
        try:
            for pools in counts:
                root = Path(d) / str(pools)
                root.mkdir()
                fleets[pools] = await fleet(root, hosts=4)
                names[pools] = [f"t{i:04d}" for i in range(pools)]
                await make_pools(fleets[pools], names[pools], max(4, (2 * n) // pools + 4))
            rng = random.Random(7)
            times: dict[int, list[float]] = {p: [] for p in counts}
            hits = dict.fromkeys(counts, 0)
            for i in range(n + 50):
                for pools in counts if i % 2 else counts[::-1]:
                    t0 = time.perf_counter()
                    r = await fleets[pools].http.post(
                        "/v1/sandboxes", json={"template": rng.choice(names[pools])}
                    )
                    if i >= 50:  # the first rounds warm both up
                        times[pools].append(time.perf_counter() - t0)
                        hits[pools] += bool(r.json()["warm"])
        finally:
            for f in fleets.values():
                await f.close()
    p100, p2000 = statistics.median(times[100]), statistics.median(times[2000])
    emit(
        bench="pools_scale",
        n=n,
        p50_ms_100_pools=round(p100 * 1000, 4),
        p50_ms_2000_pools=round(p2000 * 1000, 4),
        hits_100=hits[100],
        hits_2000=hits[2000],
        ratio=round(p2000 / p100, 3),
        bar_ratio=1.1,
    )


async def burst() -> None:
    with tempfile.TemporaryDirectory() as d:
        f = await fleet(Path(d), hosts=12)
        try:
            await make_pools(f, ["py"], 120)
            per_host = {a.id: a.warm.ready_count("py") for a in f.agents}
            rs = await asyncio.gather(
                *(f.http.post("/v1/sandboxes", json={"template": "py"}) for _ in range(100))
            )
        finally:
            await f.close()
    bodies = [r.json() for r in rs]
    hits = [b for b in bodies if b.get("warm")]
    on = Counter(b["host_id"] for b in hits)
    mean = len(hits) / len(per_host)
    emit(
        bench="burst",
        hosts=12,
        warm_per_host=sorted(set(per_host.values())),
        creates=100,
        hits=len(hits),
        max_claims_on_one_host=max(on.values()),
        max_over_mean=round(max(on.values()) / mean, 3),
        bars={"hits": 98, "max_over_mean": 1.5},
    )


def process_first_exec(n: int) -> None:
    import os
    import socket
    import subprocess
    import sys

    from corral.client import Corral

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as d:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "corral",
                "serve",
                "--runtime",
                "process",
                "--hosts",
                "2",
                "--port",
                str(port),
                "--store",
                f"sqlite:///{d}/corral.db",
                "--heartbeat-interval",
                "0.5",
                "--state-dir",
                f"{d}/state",
            ],
            env={**os.environ, "CORRAL_TOKEN": ADMIN},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            with Corral(url, ADMIN) as client:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        client.request("POST", "/v1/templates", json={"name": "sh", "memory_mb": 128})
                        break
                    except Exception:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.2)
                client.pools.create("sh", n + 4)
                while client.pools.get("sh").ready < n + 4:
                    time.sleep(0.2)
                base = client.sandboxes.create("sh", memory_mb=64)
                warm, cold, bare, hits = [], [], [], 0
                for _ in range(n):
                    t0 = time.perf_counter()
                    sb = client.sandboxes.create("sh")
                    client.sandboxes.exec(sb.id, ["true"])
                    warm.append(time.perf_counter() - t0)
                    hits += sb.warm
                    t0 = time.perf_counter()
                    client.sandboxes.exec(base.id, ["true"])
                    bare.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    sb2 = client.sandboxes.create("sh", memory_mb=64)
                    client.sandboxes.exec(sb2.id, ["true"])
                    cold.append(time.perf_counter() - t0)
                    client.sandboxes.delete(sb.id)
                    client.sandboxes.delete(sb2.id)
                client.pools.delete("sh")
                client.sandboxes.delete(base.id)
        finally:
            proc.terminate()
            proc.wait(30)
    emit(
        bench="process_first_exec",
        runtime="process",
        n=n,
        warm_hits=hits,
        warm_create_then_exec_p50_ms=pct(warm, 0.5),
        warm_create_then_exec_p99_ms=pct(warm, 0.99),
        bare_exec_p50_ms=pct(bare, 0.5),
        cold_create_then_exec_p50_ms=pct(cold, 0.5),
        aim_p50_ms=10,
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--start-latency-ms", type=float, default=20.0)
    ap.add_argument("--process", action="store_true", help="also the process runtime through the SDK")
    args = ap.parse_args()
    await agent_claim(args.n)
    await api_create(min(args.n, 1000), 0.0)
    await api_create(min(args.n, 300), args.start_latency_ms / 1000)
    await pools_scale(min(args.n, 1000))
    await burst()
    if args.process:
        process_first_exec(min(args.n, 100))


if __name__ == "__main__":
    asyncio.run(main())
