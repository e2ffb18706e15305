"""How a rejected wave comes back, and what the SDK costs per create.

1. ``herd``: N clients are refused at the same instant by a fleet that frees one slot every
   ``free_every_s``. Each strategy decides every client's next attempt; the SDK's own ``RetryPolicy``
   is driven for the ``sdk_*`` rows, the others are the textbook alternatives it was chosen over.
   Reported: peak retries in any 50 ms bucket (the height of the returning wave), total attempts,
   and time from first refusal to success (p50/p99/max). Virtual time: instant and deterministic.
2. ``overhead``: wall time per create through ``Corral`` / ``AsyncCorral`` and an in-process
   ``httpx.MockTransport`` (SDK + httpx cost, no network).

Prints one JSON object per line.  Run: ``.venv/bin/python bench/client_retry.py``
"""

from __future__ import annotations

import asyncio
import heapq
import json
import math
import random
import time
from collections import Counter
from collections.abc import Callable

import httpx

from corral.client import AsyncCorral, Corral, RetryPolicy
from corral.client.burst import percentile, run_burst

POLICY = RetryPolicy(base_s=0.25, cap_s=8.0, deadline_s=90.0)
RETRY_AFTER_S = 1.0

# strategy(retry_number, rng) -> delay in seconds
Strategy = Callable[[int, random.Random], float]

STRATEGIES: dict[str, Strategy] = {
    "sdk_full_jitter": lambda n, rng: POLICY.delay(n, None, rng),
    "sdk_retry_after_plus_jitter": lambda n, rng: POLICY.delay(n, RETRY_AFTER_S, rng),
    "exponential_no_jitter": lambda n, rng: POLICY.window(n),
    "retry_after_exact": lambda n, rng: RETRY_AFTER_S,
    "exponential_plus_10pct_noise": lambda n, rng: POLICY.window(n) * (1 + rng.uniform(0, 0.1)),
}


def herd(
    strategy: Strategy, clients: int, free_at_start: int, free_every_s: float, seed: int
) -> dict[str, float]:
    rng = random.Random(seed)
    free = free_at_start
    next_free = free_every_s
    # (time, client, retry number)
    queue: list[tuple[float, int, int]] = [(0.0, c, 0) for c in range(clients)]
    heapq.heapify(queue)
    buckets: Counter[int] = Counter()
    attempts = 0
    waited: list[float] = []
    while queue:
        now, client, retry = heapq.heappop(queue)
        while next_free <= now:
            free += 1
            next_free += free_every_s
        attempts += 1
        if retry > 0:  # the first wave is the same for everyone: measure how it comes back
            buckets[math.floor(now / 0.05)] += 1
        if free > 0:
            free -= 1
            if retry > 0:
                waited.append(now)  # every client was first refused at t=0
            continue
        delay = strategy(retry, rng)
        if now + delay <= POLICY.deadline_s:
            heapq.heappush(queue, (now + delay, client, retry + 1))
    return {
        "attempts": attempts,
        "peak_retries_per_50ms": max(buckets.values(), default=0),
        "placed_after_refusal": len(waited),
        "wait_p50_s": round(percentile(waited, 50) or 0.0, 3),
        "wait_p99_s": round(percentile(waited, 99) or 0.0, 3),
        "wait_max_s": round(max(waited, default=0.0), 3),
    }


def bench_herd() -> None:
    for name, strategy in STRATEGIES.items():
        runs = [herd(strategy, clients=50, free_at_start=10, free_every_s=0.1, seed=s) for s in range(20)]
        row: dict[str, object] = {"bench": "herd", "strategy": name, "clients": 50, "seeds": len(runs)}
        for key in runs[0]:
            row[key] = round(sum(r[key] for r in runs) / len(runs), 3)
        print(json.dumps(row))


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        201 if request.method == "POST" else 200,
        json={"id": "sb-1", "template": "t", "host_id": "h1", "state": "running"}
        if request.url.path != "/v1/hosts"
        else {"hosts": []},
    )


def bench_overhead() -> None:
    n = 2000
    with Corral("http://bench.invalid", "t", transport=httpx.MockTransport(_ok)) as client:
        client.sandboxes.create("t")
        started = time.perf_counter()
        for _ in range(n):
            client.sandboxes.create("t")
        per = (time.perf_counter() - started) / n
    print(
        json.dumps(
            {"bench": "overhead", "client": "sync", "creates": n, "us_per_create": round(per * 1e6, 1)}
        )
    )

    async def burst() -> float:
        transport = httpx.MockTransport(_ok)
        async with AsyncCorral("http://bench.invalid", "t", transport=transport) as client:
            started = time.perf_counter()
            for _ in range(20):
                await run_burst(client, 50, template="t", cleanup=False)
            return (time.perf_counter() - started) / (20 * 50)

    per = asyncio.run(burst())
    print(
        json.dumps(
            {
                "bench": "overhead",
                "client": "async_burst_50",
                "creates": 1000,
                "us_per_create": round(per * 1e6, 1),
            }
        )
    )


if __name__ == "__main__":
    bench_herd()
    bench_overhead()
