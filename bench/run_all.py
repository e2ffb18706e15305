"""Run every benchmark in bench/ and write their figures to a Markdown page (``make bench``).

    .venv/bin/python bench/run_all.py docs/benchmarks.md [--only api,placement]

Each benchmark prints JSON lines that already carry their in-run comparison (a ceiling, a baseline,
the previous behaviour); this page puts each line's figures side by side, one table per benchmark,
with the date, the machine and the exact command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Each benchmark and the arguments it runs with here (sized for a few minutes in all).
BENCHES: dict[str, list[str]] = {
    "placement": ["--quick"],
    "sim": ["--creates", "50000"],
    "store": ["--seconds", "2"],
    "agent": ["--quick"],
    "client_retry": [],
    "runtime": ["--sequential", "20", "--rounds", "3", "--idle", "10"],
    "rootfs": ["--n", "20", "--fetches", "2", "--density", "200"],
    "api": ["--duration", "5"],
    "heartbeat": [],
    "first_run": [],
    "cli_start": [],
    "isolation": ["--samples", "1000"],
    "fairness": [],
    "kube": ["--claims", "50", "--kubectl", "5", "--changes", "20"],
}
WHAT = {
    "placement": "one placement decision in process, by fleet size and policy; `bare_p2` is the floor",
    "sim": "the simulator's speed per policy",
    "store": "reservations per second on each store; the raw ceiling is measured in the same run",
    "agent": "agent start / heartbeat costs and a start burst against its limiter",
    "client_retry": "how a refused wave returns per retry strategy, and the SDK's cost per create",
    "runtime": "process sandboxes: create to first exec, and memory per idle sandbox",
    "rootfs": "image sandboxes (the test suite's small base): create to first exec beside a host-root create "
    "(bar: p50 <= 2x and <= 50 ms), the first create on a host without the image beside a cached one, and "
    "the host disk of 200 sandboxes of one image beside 200 x the image (bar: < 1.2 x one image plus "
    "what their layers hold)",
    "api": "creates/s over HTTP and HTTPS (wrk; kept-alive connections, and a new one per create) beside "
    "a bare FastAPI endpoint on the same server settings and transport, with 0, 20,000 and 100,000 live "
    "sandboxes already recorded; an https line's `tls_cost_*` is what TLS costs beside http (the bar: "
    "<= 0.15 of creates/s)",
    "heartbeat": "the control plane's CPU per heartbeat for a host of 10, 1,000 and 10,000 sandboxes",
    "first_run": "`corral serve` + `corral burst -n 50`, beside the same with the previous 512 MiB reserve floor",
    "cli_start": "a CLI call's wall time (`corral version`, `corral ps`) beside `python -c pass` and every command imported",
    "isolation": "tenant B's GET and exec p50/p99 alone and under tenant A's 800 concurrent execs "
    "(re-sent as each is answered); the bar is B's p99 under the flood <= 3x alone",
    "fairness": "tenant B's create p50/p99 (one per 100 ms) alone, under tenant A's 48 create-and-delete "
    "loops, and under them with A's create rate; the bar is B's p99 under the limited flood <= 2x alone",
    "kube": "the Kubernetes surface: a SandboxClaim to Ready beside a REST warm create, and through a real "
    "kubectl; a Table list of 10,000 sandboxes beside the REST list; get by name; a watch event on another "
    "replica (PostgreSQL, 100 watches). Bars: claim p50 <= 5 ms, Table list <= 200 ms, watch p99 <= 100 ms",
}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores{mem}; {platform.system()} {platform.release()}; "
        f"Python {platform.python_version()}"
    )


def run(name: str, args: list[str]) -> tuple[list[dict[str, Any]], float, str]:
    started = time.monotonic()
    out = subprocess.run(
        [sys.executable, str(HERE / f"{name}.py"), *args], capture_output=True, text=True, check=False
    )
    rows = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    error = "" if out.returncode == 0 else (out.stderr.strip().splitlines() or ["failed"])[-1]
    return rows, time.monotonic() - started, error


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.3g}" if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":")).replace("|", "\\|")
    return str(value).replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> list[str]:
    keys: list[str] = []
    for r in rows:
        for k in r:
            if k != "bench" and k not in keys:
                keys.append(k)
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r.get(k, "")) for k in keys) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", default="", help="comma-separated benchmark names")
    args = parser.parse_args()
    chosen = [n for n in BENCHES if not args.only or n in args.only.split(",")]
    page = [
        "# Benchmarks",
        "",
        f"Measured {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC on {machine()}.",
        "Written by `make bench` (`bench/run_all.py`); every figure sits beside the comparison its "
        "benchmark measures in the same run. A shared or busy machine moves absolute numbers; the "
        "side-by-side ratios move less.",
        "",
    ]
    for name in chosen:
        print(f"bench/{name}.py ...", file=sys.stderr, flush=True)
        rows, seconds, error = run(name, BENCHES[name])
        for r in rows:
            print(json.dumps(r), flush=True)
        page += [
            f"## {name}",
            "",
            f"{WHAT[name]}. `bench/{name}.py {' '.join(BENCHES[name])}`, {seconds:.0f} s.",
            "",
        ]
        if error:
            page += [f"Failed: `{error}`", ""]
        if rows:
            page += [*table(rows), ""]
    args.out.write_text("\n".join(page))
    print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
