"""Benchmarks of the host agent over the sim runtime. Prints one JSON object per line.

    .venv/bin/python bench/agent.py [--quick]

- ``start``: one start through the local gate (core arithmetic over every live sandbox), by host size,
  in-process and over HTTP (ASGI, no sockets).
- ``heartbeat``: measure every sandbox + build one heartbeat, by host size.
- ``burst``: 40 simultaneous starts on a host whose starts take 50 ms, limit 8: how many are admitted,
  and how fast the rest are refused (a saturated host says "not now" at once, so the create tries
  another host instead of queueing behind slow starts).
- ``fleet``: a 12-host sim fleet filled with thousands of sandboxes, then one heartbeat round.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import httpx

from corral.agent import Agent, AgentConfig, AgentRefusal, HttpAgentClient, LocalAgentClient, StartSandbox
from corral.agent.client import AgentClient
from corral.agent.http import create_app
from corral.core.clock import ManualClock
from corral.runtime.sim import SimRuntime

TOKEN = "bench"


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def make_agent(clock: ManualClock, seed: int = 0, **kwargs: Any) -> Agent:
    """An agent over a sim runtime (``runtime_kwargs``); the other ``kwargs`` are its settings."""
    runtime = SimRuntime(clock, random.Random(seed), **kwargs.pop("runtime_kwargs", {}))
    return Agent(
        AgentConfig(f"h{seed}", 1 << 22, 256.0, **kwargs), runtime, clock=clock, pressure=lambda: 0.0
    )


async def bench_start(sizes: list[int], samples: int) -> None:
    for transport in ("local", "http"):
        for size in sizes:
            clock = ManualClock(0.0)
            agent = make_agent(clock)
            for i in range(size):
                await agent.start(StartSandbox(id=f"pre-{i}", memory_mb=1024))
            client: AgentClient
            if transport == "local":
                client = LocalAgentClient(agent)
            else:
                app = create_app(agent, TOKEN)
                client = HttpAgentClient("http://agent", TOKEN, transport=httpx.ASGITransport(app))
            lat: list[float] = []
            for i in range(samples):
                t0 = time.perf_counter()
                await client.start(StartSandbox(id=f"b-{i}", memory_mb=1024))
                lat.append(time.perf_counter() - t0)
                await client.stop(f"b-{i}")
            await client.aclose()
            emit(
                bench="start",
                transport=transport,
                live_sandboxes=size,
                samples=samples,
                p50_us=round(pct(lat, 0.5) * 1e6, 1),
                p99_us=round(pct(lat, 0.99) * 1e6, 1),
                starts_per_s=round(samples / sum(lat)),
            )


async def bench_heartbeat(sizes: list[int]) -> None:
    for size in sizes:
        clock = ManualClock(0.0)
        agent = make_agent(clock)
        for i in range(size):
            await agent.start(StartSandbox(id=f"s-{i}", memory_mb=2048))
        clock.advance(30)
        lat = []
        for _ in range(10):
            t0 = time.perf_counter()
            await agent.beat()
            lat.append(time.perf_counter() - t0)
        emit(
            bench="heartbeat",
            live_sandboxes=size,
            p50_ms=round(statistics.median(lat) * 1e3, 2),
            max_ms=round(max(lat) * 1e3, 2),
        )


async def bench_burst(burst: int = 40, limit: int = 8, start_s: float = 0.05) -> None:
    clock = ManualClock(0.0)
    agent = make_agent(clock, max_concurrent_starts=limit, runtime_kwargs={"start_latency_s": start_s})

    async def one(i: int) -> tuple[bool, float]:
        t0 = time.perf_counter()
        try:
            await agent.start(StartSandbox(id=f"burst-{i}", memory_mb=1024))
            return True, time.perf_counter() - t0
        except AgentRefusal:
            return False, time.perf_counter() - t0

    results = await asyncio.gather(*(one(i) for i in range(burst)))
    ok = [t for admitted, t in results if admitted]
    refused = [t for admitted, t in results if not admitted]
    emit(
        bench="burst",
        burst=burst,
        max_concurrent_starts=limit,
        runtime_start_ms=start_s * 1e3,
        admitted=len(ok),
        refused=len(refused),
        admitted_p50_ms=round(statistics.median(ok) * 1e3, 1) if ok else None,
        refused_p50_ms=round(statistics.median(refused) * 1e3, 1) if refused else None,
        refused_max_ms=round(max(refused) * 1e3, 1) if refused else None,
    )


async def bench_fleet(hosts: int, sandboxes: int) -> None:
    clock = ManualClock(0.0)
    agents = [make_agent(clock, seed=n) for n in range(hosts)]
    clients = [LocalAgentClient(a) for a in agents]
    t0 = time.perf_counter()
    for i in range(sandboxes):
        await clients[i % hosts].start(StartSandbox(id=f"sb-{i}", memory_mb=2048))
    filled = time.perf_counter() - t0
    clock.advance(30)
    t1 = time.perf_counter()
    beats = [await a.beat() for a in agents]
    round_s = time.perf_counter() - t1
    emit(
        bench="fleet",
        hosts=hosts,
        sandboxes=sum(len(b.sandbox_ids) for b in beats),
        fill_s=round(filled, 3),
        starts_per_s=round(sandboxes / filled),
        heartbeat_round_ms=round(round_s * 1e3, 1),
    )


async def main(quick: bool) -> None:
    sizes = [0, 500, 2000] if not quick else [0, 200]
    await bench_start(sizes, 200 if not quick else 50)
    await bench_heartbeat([250, 1000, 4000] if not quick else [250])
    await bench_burst()
    await bench_fleet(12, 6000 if not quick else 1200)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    asyncio.run(main(parser.parse_args().quick))
