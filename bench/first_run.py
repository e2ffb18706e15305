"""A newcomer's first run, measured: ``corral serve`` with its default flags, then ``corral burst -n 50``
as the README says, several times. Side by side in the same run, the same server with the previous
default charge for a sandbox not measured yet (512 MiB at least: on twelve 2 GiB hosts, 36 unmeasured
creates fit, so a burst of 50 was refused and retried until readings came). Then a 45 s command
through ``corral exec`` as a user types it (past any HTTP client's usual 30 s): when its first line
arrived, when it returned, its exit code. JSON lines.

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
LEGACY_RESERVE_FLOOR_MB = 512


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


LONG_S = 45


def long_exec(url: str) -> dict[str, Any]:
    """``corral create``, then a command of LONG_S seconds printing a line a second through ``corral
    exec``: the first line's arrival (streamed, not at the end), the whole call, the exit code."""
    env = {**os.environ, "CORRAL_URL": url, "CORRAL_TOKEN": TOKEN}
    corral = [sys.executable, "-m", "corral"]
    sid = subprocess.run(
        [*corral, "create", "--memory-mb", "64"], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    script = f"for i in $(seq {LONG_S}); do echo $i; sleep 1; done; exit 7"
    started = time.monotonic()
    proc = subprocess.Popen(
        [*corral, "exec", sid, "--", "sh", "-c", script], env=env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()
    first_at = time.monotonic() - started
    lines = 1 + len(proc.stdout.read().splitlines())
    code = proc.wait()
    subprocess.run([*corral, "rm", sid], env=env, capture_output=True, check=False)
    return {
        "long_exec_s": LONG_S,
        "long_exec_first_line_s": round(first_at, 2),
        "long_exec_total_s": round(time.monotonic() - started, 2),
        "long_exec_lines": lines if first else 0,
        "long_exec_exit_code": code,
    }


def run(
    label: str, extra: list[str], bursts: int, count: int, tmp: Path, *, long: bool = False
) -> dict[str, Any]:
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
        extra_figures = long_exec(url) if long else {}
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
        **extra_figures,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bursts", type=int, default=3)
    parser.add_argument("--count", type=int, default=50)
    parser.add_argument("--no-long-exec", action="store_true", help=f"skip the {LONG_S} s exec")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="corral-first-run-"))
    try:
        now = run("default", [], args.bursts, args.count, tmp, long=not args.no_long_exec)
        before = run(
            "legacy", ["--reserve-floor-mb", str(LEGACY_RESERVE_FLOOR_MB)], args.bursts, args.count, tmp
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(
        json.dumps(
            {
                "bench": "first_run",
                "target": f"corral serve (defaults), corral burst -n {args.count}, x{args.bursts}",
                **now,
                "comparison": f"same, --reserve-floor-mb {LEGACY_RESERVE_FLOOR_MB} (the previous default)",
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
