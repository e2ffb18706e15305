"""A newcomer's first run, measured: ``corral serve`` with its default flags, then ``corral burst -n 50``
as the README says, several times. Side by side in the same run, the same server with the memory
settle time every runtime had before (10 s, the guest ramp's): what the burst cost when a process
sandbox's 1 MiB reading was ignored for ten seconds. JSON lines.

    .venv/bin/python bench/first_run.py [--bursts 3] [--count 50]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api import free_port, wait_ready

TOKEN = "bench-admin-token-0123456789"
LEGACY_SETTLE_S = 10.0


def burst(url: str, count: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "corral", "burst", "-n", str(count), "--json"],
        env={**os.environ, "CORRAL_URL": url, "CORRAL_TOKEN": TOKEN},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data: dict[str, Any] = json.loads(out)
    return data


def run(label: str, extra: list[str], bursts: int, count: int, tmp: Path) -> dict[str, Any]:
    port = free_port()
    state = tmp / label
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "corral",
            "serve",
            "--port",
            str(port),
            "--store",
            f"sqlite:///{state}.db",
            "--state-dir",
            str(state),
            *extra,
        ],
        env={**os.environ, "CORRAL_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    results = []
    try:
        wait_ready(url, server)
        for _ in range(bursts):
            results.append(burst(url, count))
            # the burst deletes what it made; let the hosts' next heartbeats show them empty again
            time.sleep(3.0)
    finally:
        server.terminate()
        server.wait(60)
    return {
        "p50_ms": round(statistics.median(r["p50_ms"] for r in results), 1),
        "p99_ms": round(max(r["p99_ms"] for r in results), 1),
        "p99_ms_each": [round(r["p99_ms"], 1) for r in results],
        "placed": min(r["placed"] for r in results),
        "max_per_host": max(r["max"] for r in results),
        "retried": sum(sum(r["retried"].values()) for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="corral-first-run-"))
    try:
        now = run("default", [], args.bursts, args.count, tmp)
        before = run("legacy", ["--memory-settle-s", str(LEGACY_SETTLE_S)], args.bursts, args.count, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "first_run",
                "target": f"corral serve (defaults), corral burst -n {args.count}, x{args.bursts}",
                **now,
                "comparison": f"same, --memory-settle-s {LEGACY_SETTLE_S:g}",
                "comparison_p50_ms": before["p50_ms"],
                "comparison_p99_ms": before["p99_ms"],
                "comparison_retried": before["retried"],
                "comparison_max_per_host": before["max_per_host"],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
