"""``corral serve --runtime sim`` with ``N`` live sandboxes already recorded before it serves: bench/api.py
runs this to measure the create path as the fleet fills.

    python bench/filled_serve.py N --port P --store sqlite:///x.db [--hosts 12] [--tls-dir DIR]
        [--heartbeat-interval S]

The sandboxes are real to everything that looks: each runs in its sim host's runtime (the agent adopts
it at start and lists it in every heartbeat) and has a running record in the store, owned by a tenant of
its own. The records are written in bulk through the store's own transaction, not by N creates: seeding
100,000 through the API would take longer than the measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from seed import record_running, sandbox_id  # bench/ is the script's directory

from corral.api.server import ServeOptions, run, serve
from corral.control.localfleet import LocalFleet
from corral.control.plane import ControlPlane
from corral.runtime.base import SandboxSpec
from corral.runtime.sim import SimRuntime
from corral.store.sql import SqlStore

MEMORY_MB = 256


async def fill(plane: ControlPlane, fleet: LocalFleet, n: int) -> None:
    store = plane.store
    assert isinstance(store, SqlStore), "filling needs a SQL store"
    started = time.perf_counter()
    tenant = await store.create_tenant(
        "fleet", max_sandboxes=n + 1, max_memory_mb=(n + 1) * MEMORY_MB, max_cpus=float(n + 1)
    )
    placed = []
    for i in range(n):
        agent = fleet.agents[i % len(fleet.agents)]
        runtime = agent.runtime
        assert isinstance(runtime, SimRuntime), "filling needs the sim runtime"
        sid = sandbox_id()
        await runtime.start(SandboxSpec(id=sid, memory_mb=MEMORY_MB))
        placed.append((sid, agent.id))
    await record_running(store, tenant.id, placed, MEMORY_MB, plane.clock.now())
    print(json.dumps({"filled": n, "seconds": round(time.perf_counter() - started, 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sandboxes", type=int)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--hosts", type=int, default=12)
    parser.add_argument("--tls-dir", type=Path, default=None, help="serve HTTPS with the certificate there")
    parser.add_argument("--heartbeat-interval", type=float, default=2.0)
    args = parser.parse_args()
    opts = ServeOptions(
        port=args.port,
        store=args.store,
        hosts=args.hosts,
        runtime="sim",
        host_memory_mb=64 * 1024 * 1024,
        host_cpus=1_000_000.0,
        admin_token=os.environ["CORRAL_TOKEN"],
        tls_dir=args.tls_dir,
        heartbeat_interval_s=args.heartbeat_interval,
    )

    async def prepare(plane: ControlPlane, fleet: LocalFleet) -> None:
        if args.sandboxes:
            await fill(plane, fleet, args.sandboxes)

    run(serve(opts, prepare), "json")


if __name__ == "__main__":
    main()
