"""The control plane's CPU per heartbeat, for a host holding 10, 1,000 and 10,000 sandboxes. JSON lines.

    .venv/bin/python bench/heartbeat.py [--sizes 10 1000 10000] [--beats 50] [--store sqlite|postgresql://...]

Every sandbox the host lists is running and recorded, and each heartbeat finds a few reservations to
confirm, as under a steady stream of creates. Per heartbeat, CPU time of this process (the store's
worker thread included) for what a replica does with one: ``parse_ms`` validates the wire body (the
route's model), ``intake_ms`` is ``ControlPlane.heartbeat_reply`` (the store's upsert and reservation
confirmation), ``view_read_ms`` is reading that host's row back as the placement view does (every
replica re-reads every host row each view TTL). The agent's own work is not counted.

The agent takes each reply as a live agent does, so after the first heartbeat (the whole set) each one
carries only what changed and its digest; ``x_of_smallest`` compares each size with the first one. The
script runs unchanged against an older tree whose heartbeats list every sandbox (run it with that
tree on PYTHONPATH for an A/B).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

from seed import record_running, sandbox_id  # bench/ is the script's directory

from corral.agent import protocol
from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.clock import SystemClock
from corral.control.agents import HttpAgents, LocalAgents
from corral.control.config import ControlConfig
from corral.control.plane import build_replica
from corral.core import AdmissionMode, AdmissionPolicy
from corral.runtime.base import SandboxSpec
from corral.runtime.sim import SimRuntime
from corral.store import open_store
from corral.store.sql import SqlStore

MEMORY_MB = 256
RESERVATIONS_PER_BEAT = 5


async def measure(store_url: str, size: int, beats: int) -> dict[str, object]:
    store = open_store(store_url)
    assert isinstance(store, SqlStore), "this benchmark needs a SQL store"
    try:
        await store.migrate()
        clock = SystemClock()
        plane = build_replica(
            store, LocalAgents(HttpAgents(store.host_key)), ControlConfig(), clock, random.Random()
        )
        host_id = f"hb-{size}"
        runtime = SimRuntime(clock=clock, rng=random.Random(size))
        agent = Agent(
            AgentConfig(
                host_id,
                64 * 1024 * 1024,
                1_000_000.0,
                admission=AdmissionMode.WORKING_SET,
                policy=AdmissionPolicy(),
            ),
            runtime,
            clock=clock,
        )
        tenant = await store.create_tenant(
            f"bench-{size}-{sandbox_id()[-8:]}",
            max_sandboxes=10 * size + 10_000,
            max_memory_mb=1 << 40,
            max_cpus=float(1 << 30),
        )
        placed = []
        for _ in range(size):
            sid = sandbox_id()
            await runtime.start(SandboxSpec(id=sid, memory_mb=MEMORY_MB))
            placed.append((sid, host_id))
        await record_running(store, tenant.id, placed, MEMORY_MB, clock.now())
        await agent.adopt()
        await agent.measure()
        # An older agent has no acknowledge(): its heartbeats are always whole, and only the secrets
        # of adopted sandboxes are taken from the reply (so they are asked for once, as in a live agent).
        acknowledge = getattr(
            agent, "acknowledge", lambda hb, reply: agent._restore_secrets(hb.restore, reply.secrets)
        )
        wire = getattr(protocol, "AgentHeartbeat", None) or protocol.Heartbeat  # type: ignore[attr-defined]
        first = agent.heartbeat()
        acknowledge(first, await plane.heartbeat_reply(first))  # the host exists before the timed beats
        parse = intake = view = 0.0
        for _ in range(beats):
            # A few creates landed on this host since the last beat: reserved, then started.
            for _ in range(RESERVATIONS_PER_BEAT):
                sid = sandbox_id()
                res = await store.reserve(
                    host_id, memory_mb=MEMORY_MB, owner="bench", ttl_s=60, sandbox_id=sid
                )
                assert res is not None
                await runtime.start(SandboxSpec(id=sid, memory_mb=MEMORY_MB))
            await agent.adopt()
            agent_hb = agent.heartbeat()
            body = agent_hb.model_dump_json()
            t0 = time.process_time()
            hb = wire.model_validate_json(body)
            t1 = time.process_time()
            reply = await plane.heartbeat_reply(hb)
            t2 = time.process_time()
            await store.get_host(host_id)
            t3 = time.process_time()
            acknowledge(agent_hb, reply)
            assert reply.accepted and reply.confirmed == RESERVATIONS_PER_BEAT, reply
            parse += t1 - t0
            intake += t2 - t1
            view += t3 - t2
        return {
            "bench": "heartbeat",
            "store": store_url.split(":", 1)[0],
            "sandboxes_on_host": size,
            "body_kb": round(len(body) / 1024, 1),
            "parse_ms": round(parse / beats * 1000, 3),
            "intake_ms": round(intake / beats * 1000, 3),
            "view_read_ms": round(view / beats * 1000, 3),
            "cpu_ms_per_heartbeat": round((parse + intake + view) / beats * 1000, 3),
        }
    finally:
        await store.close()


async def run(args: argparse.Namespace) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="corral-hb-"))
    first: float | None = None
    for size in args.sizes:
        url = args.store if args.store != "sqlite" else f"sqlite:///{tmp}/hb-{size}.db"
        out = await measure(url, size, args.beats)
        cpu = float(out["cpu_ms_per_heartbeat"])  # type: ignore[arg-type]
        first = first if first is not None else cpu
        out["x_of_smallest"] = round(cpu / first, 2) if first else None
        print(json.dumps(out), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 1_000, 10_000])
    parser.add_argument("--beats", type=int, default=50)
    parser.add_argument(
        "--store", default="sqlite", help="sqlite (a fresh file per size) or a PostgreSQL URL"
    )
    args = parser.parse_args()
    if args.beats < 1:
        sys.exit("--beats must be at least 1")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
