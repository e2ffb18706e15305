"""Simulator speed: a fleet of 1,000 hosts taking 100,000 creates, per O(1) policy, one JSON line each.

.venv/bin/python bench/sim.py [--hosts N] [--creates N] [--policies corral,power_of_2,random]
"""

from __future__ import annotations

import argparse
import json
import time

from corral.core import CreateRequest
from corral.sim.baselines.fleet import ModelFleet, ModelFleetConfig
from corral.sim.baselines.policies import policy
from corral.sim.scenario import HostSpec


def bench(name: str, hosts: int, creates: int, rate_per_s: float, seed: int) -> dict[str, object]:
    cfg = ModelFleetConfig(
        hosts=hosts,
        policy=policy(name),
        host=HostSpec(heartbeat_s=10.0),
        replicas=4,
        view_ttl_s=1.0,
    )
    started = time.perf_counter()
    fleet = ModelFleet(cfg, seed)
    req = CreateRequest(memory_mb=4096)
    t0 = 12.0  # every host has heartbeated
    duration = creates / rate_per_s
    # Submit exactly `creates` arrivals, evenly spread with exponential lifetimes (mean 60 s).
    rng = fleet.stream("bench")
    for i in range(creates):
        fleet.submit(req, t0 + i * duration / creates, rng.expovariate(1 / 60.0))
    fleet.run(t0 + duration + 1.0)
    wall = time.perf_counter() - started
    m = fleet.metrics
    return {
        "bench": "sim",
        "policy": name,
        "hosts": hosts,
        "creates": creates,
        "replicas": 4,
        "virtual_s": round(duration, 1),
        "placed": m.placed,
        "refusals": sum(m.refusals.values()),
        "events": fleet.loop.processed,
        "wall_s": round(wall, 2),
        "creates_per_wall_s": round(creates / wall),
        "events_per_wall_s": round(fleet.loop.processed / wall),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--creates", type=int, default=100_000)
    ap.add_argument("--rate", type=float, default=500.0, help="creates per virtual second")
    ap.add_argument("--policies", default="corral,power_of_2,random")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    for name in args.policies.split(","):
        print(json.dumps(bench(name.strip(), args.hosts, args.creates, args.rate, args.seed)), flush=True)


if __name__ == "__main__":
    main()
