"""How long a command of the CLI takes to start and answer: ``corral version`` and ``corral ps`` (against
a port nothing listens on, so it answers ``unreachable`` at once) beside ``python -c pass`` and beside
importing every command's module (what each call cost before commands were loaded only when run), in
the same run. JSON lines, one per command: the median and the worst wall time over ``--runs``.

    .venv/bin/python bench/cli_start.py [--runs 10]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

EAGER = (
    "import corral.cli, corral.api.cli, corral.client.cli, corral.client.pools_cli, "
    "corral.client.tenants_cli, corral.agent.cli, corral.sim.cli"
)
COMMANDS = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "corral version": [sys.executable, "-m", "corral", "version"],
    "corral ps (unreachable)": [sys.executable, "-m", "corral", "ps", "--url", "http://127.0.0.1:9"],
    "every command imported (before)": [sys.executable, "-c", EAGER],
}


def wall(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ}, check=False
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    for argv in COMMANDS.values():
        wall(argv)  # warm the file cache and bytecode
    for name, argv in COMMANDS.items():
        times = [wall(argv) for _ in range(args.runs)]
        line = {"bench": "cli_start", "command": name, "runs": args.runs}
        line |= {"median_s": round(statistics.median(times), 3), "max_s": round(max(times), 3)}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
