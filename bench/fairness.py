"""One tenant's flood against another's steady creates, with and without per-tenant create rates, in one
run. JSON lines.

    .venv/bin/python bench/fairness.py [--b-creates 100] [--flood 48] [--rate 20]

corral runs as ``corral serve --runtime sim --hosts 12`` with hosts large enough that capacity never
refuses. Tenant B sends one create every 100 ms (each deleted after it is timed) and its create
latency is measured three ways on one server:

- ``alone``: nothing else runs;
- ``flood``: tenant A runs ``--flood`` concurrent create-and-delete loops, A without a create rate;
- ``flood_limited``: the same flood, A given ``--rate`` creates a second (PATCH /v1/tenants/A).

A's loops run in a process of their own (so B's timings are not its event loop's), each through the
SDK, which backs off from 429 ``tenant_rate_limited`` as from a 503. The bar: B's p99 under the
limited flood at most twice its p99 alone.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from api import free_port, wait_ready  # bench/ is the script's directory

from corral.client import AsyncCorral, CorralError, RetryPolicy

TOKEN = "bench-admin-token-0123456789"
BODY = {"memory_mb": 256}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


# -- tenant A: the flood, in its own process --------------------------------------------------------


async def flood(url: str, token: str, loops: int, seconds: float) -> dict[str, object]:
    created = refused = failed = 0
    stop = time.monotonic() + seconds
    # The SDK's own backoff, with a deadline well past the run: a refused create comes back later.
    policy = RetryPolicy(base_s=0.25, cap_s=4.0, deadline_s=seconds + 30)
    async with AsyncCorral(url, token, retry=policy, timeout_s=30) as client:

        async def loop() -> None:
            nonlocal created, refused, failed
            while time.monotonic() < stop:
                try:
                    sb = await client.sandboxes.create("default", memory_mb=BODY["memory_mb"])
                except CorralError:
                    failed += 1
                    continue
                created += 1
                stats = sb.create_stats
                refused += sum(stats.refusals.values()) if stats is not None else 0
                try:
                    await sb.kill()
                except CorralError:
                    failed += 1

        await asyncio.gather(*(loop() for _ in range(loops)))
    return {"created": created, "refused": refused, "failed": failed}


# -- tenant B: one create per 100 ms, timed ---------------------------------------------------------


async def steady(url: str, token: str, n: int, every_s: float) -> dict[str, object]:
    lat: list[float] = []
    codes: dict[int, int] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as http:
        for _ in range(n):
            tick = time.perf_counter()
            r = await http.post("/v1/sandboxes", json=BODY)
            lat.append((time.perf_counter() - tick) * 1000)
            codes[r.status_code] = codes.get(r.status_code, 0) + 1
            if r.status_code == 201:
                await http.delete(f"/v1/sandboxes/{r.json()['id']}")
            await asyncio.sleep(max(0.0, every_s - (time.perf_counter() - tick)))
    return {
        "creates": n,
        "codes": {str(k): v for k, v in sorted(codes.items())},
        "p50_ms": round(statistics.median(lat), 2),
        "p99_ms": round(pct(lat, 0.99), 2),
        "max_ms": round(max(lat), 2),
    }


def admin(url: str, method: str, path: str, body: dict[str, object]) -> dict[str, object]:
    r = httpx.request(method, url + path, json=body, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    r.raise_for_status()
    out: dict[str, object] = r.json()
    return out


def run_flood(url: str, token: str, loops: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, __file__, "--flood-only", url, token, str(loops), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
    )


def phase(name: str, url: str, b: str, a: str | None, args: argparse.Namespace) -> dict[str, object]:
    seconds = args.b_creates * 0.1 + 2.0
    proc = run_flood(url, a, args.flood, seconds) if a is not None else None
    if proc is not None:
        time.sleep(1.0)  # the flood is in full swing before B's first create
    got = asyncio.run(steady(url, b, args.b_creates, 0.1))
    line: dict[str, object] = {"bench": "fairness", "phase": name, "tenant": "B", **got}
    if proc is not None:
        out, _ = proc.communicate(timeout=seconds + 120)
        line["flood"] = {"loops": args.flood, **json.loads(out.strip().splitlines()[-1])}
    return line


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--b-creates", type=int, default=100)
    parser.add_argument("--flood", type=int, default=48)
    parser.add_argument("--rate", type=float, default=20.0)
    parser.add_argument("--flood-only", nargs=4, metavar=("URL", "TOKEN", "LOOPS", "SECONDS"))
    args = parser.parse_args()
    if args.flood_only:
        url, token, loops, seconds = args.flood_only
        print(json.dumps(asyncio.run(flood(url, token, int(loops), float(seconds)))), flush=True)
        return

    tmp = Path(tempfile.mkdtemp(prefix="corral-fairness-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [
            *(
                sys.executable,
                "-m",
                "corral",
                "serve",
                "--runtime",
                "sim",
                "--hosts",
                "12",
                "--port",
                str(port),
            ),
            *("--store", f"sqlite:///{tmp / 'fairness.db'}", "--host-memory-mb", str(1 << 20)),
        ],
        env={**os.environ, "CORRAL_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(url, server)
        quota = {"max_sandboxes": 100_000, "max_memory_mb": 1 << 30, "max_cpus": 1e6}
        a = str(admin(url, "POST", "/v1/tenants", {"name": "a", **quota})["token"])
        b = str(admin(url, "POST", "/v1/tenants", {"name": "b", **quota})["token"])
        lines = [phase("alone", url, b, None, args), phase("flood", url, b, a, args)]
        admin(url, "PATCH", "/v1/tenants/a", {"create_rate_per_s": args.rate})
        lines.append(phase("flood_limited", url, b, a, args))
        lines[-1]["a_rate_per_s"] = args.rate
        for line in lines:
            print(json.dumps(line), flush=True)
        alone, limited = lines[0]["p99_ms"], lines[-1]["p99_ms"]
        assert isinstance(alone, float) and isinstance(limited, float)
        print(
            json.dumps(
                {
                    "bench": "fairness",
                    "summary": "B p99 under A's flood over B p99 alone",
                    "unlimited_ratio": round(float(lines[1]["p99_ms"]) / alone, 2),  # type: ignore[arg-type]
                    "limited_ratio": round(limited / alone, 2),
                    "bar": 2.0,
                    "meets_bar": limited <= 2 * alone,
                }
            ),
            flush=True,
        )
    finally:
        server.terminate()
        server.wait(60)


if __name__ == "__main__":
    main()
