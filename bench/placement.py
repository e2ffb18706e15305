"""In-process cost of one placement decision (filter + score + reserve in the in-memory ledger) by
fleet size and policy. One JSON object per line.

    .venv/bin/python bench/placement.py [--quick]

Also prints a ``bare_p2`` line: the same power-of-two arithmetic written as a flat loop with no
corral code, the floor against which the pipeline's overhead can be read in the same run.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from corral.core import (
    CreateRequest,
    FullScan,
    HostView,
    Ledger,
    ManualClock,
    Naive,
    Placer,
    PowerOfK,
    Scheduler,
    Selector,
)

POLICIES: dict[str, Selector] = {"power_of_2": PowerOfK(2), "full_scan": FullScan(), "naive": Naive()}


def make_fleet(n: int, rng: random.Random) -> list[HostView]:
    return [
        HostView(
            id=f"host-{i:06d}",
            heartbeat_at=0.0,
            cpu_total=64.0,
            cpu_used=rng.uniform(0, 32),
            memory_mb_total=262144,
            memory_mb_used=rng.randrange(0, 131072),
            memory_mb_admittable=rng.randrange(65536, 200000),
        )
        for i in range(n)
    ]


def percentile(sorted_ns: list[int], q: float) -> float:
    return sorted_ns[min(len(sorted_ns) - 1, int(q * len(sorted_ns)))] / 1000.0


def run_policy(name: str, hosts: list[HostView], iterations: int) -> dict[str, object]:
    clock = ManualClock()
    ledger = Ledger(clock, ttl_s=60)
    sched = Scheduler(Placer(selector=POLICIES[name]), ledger, random.Random(7), owner="bench")
    req = CreateRequest(memory_mb=1024, cpu=1.0)
    samples: list[int] = []
    held = []
    perf = time.perf_counter_ns
    for i in range(iterations):
        t0 = perf()
        _, res = sched.schedule(hosts, req, now=1.0)
        samples.append(perf() - t0)
        held.append(res)
        if len(held) >= 512:  # keep the ledger at a steady, realistic size
            for r in held[:256]:
                r.release()  # type: ignore[union-attr]
            del held[:256]
        if i % 1000 == 0:
            clock.advance(0.001)
    samples.sort()
    return {
        "bench": "placement",
        "policy": name,
        "hosts": len(hosts),
        "iterations": iterations,
        "p50_us": round(percentile(samples, 0.50), 2),
        "p99_us": round(percentile(samples, 0.99), 2),
        "mean_us": round(statistics.fmean(samples) / 1000.0, 2),
    }


def run_bare(hosts: list[HostView], iterations: int) -> dict[str, object]:
    """Power of two with the arithmetic inlined: no filters, no ledger objects, no corral calls."""
    rng = random.Random(7)
    pending: dict[str, int] = {}
    n = len(hosts)
    samples: list[int] = []
    perf = time.perf_counter_ns
    for _ in range(iterations):
        t0 = perf()
        best = None
        best_free = -1
        for _ in range(2):
            h = hosts[int(rng.random() * n)]
            free = h.memory_mb_admittable - pending.get(h.id, 0) - 1024
            if h.state == "ready" and free >= 0 and free > best_free:
                best, best_free = h, free
        if best is not None:
            pending[best.id] = pending.get(best.id, 0) + 1024
        samples.append(perf() - t0)
    samples.sort()
    return {
        "bench": "placement",
        "policy": "bare_p2",
        "hosts": n,
        "iterations": iterations,
        "p50_us": round(percentile(samples, 0.50), 2),
        "p99_us": round(percentile(samples, 0.99), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer iterations (smoke run)")
    args = parser.parse_args()
    rng = random.Random(42)
    results: dict[tuple[str, int], dict[str, object]] = {}
    for n in (100, 1_000, 10_000, 100_000):
        hosts = make_fleet(n, rng)
        for name in POLICIES:
            scan = name != "power_of_2"
            budget = 2_000_000 if not args.quick else 200_000
            iterations = max(20, min(20_000, budget // n)) if scan else (20_000 if not args.quick else 2_000)
            results[(name, n)] = r = run_policy(name, hosts, iterations)
            print(json.dumps(r), flush=True)
        print(json.dumps(run_bare(hosts, 20_000 if not args.quick else 2_000)), flush=True)
    small, big = results[("power_of_2", 100)], results[("power_of_2", 100_000)]
    ratio = float(big["p50_us"]) / float(small["p50_us"])  # type: ignore[arg-type]
    print(
        json.dumps(
            {"bench": "placement", "summary": "power_of_2_p50_100k_over_100", "ratio": round(ratio, 3)}
        )
    )


if __name__ == "__main__":
    main()
