"""Side by side: this tree's process runtime against a baseline tree's (another checkout of corral), in
interleaved rounds on the same machine, so load from neighbours lands on both. Prints one JSON line per
round and side, then one summary line per measurement with the median of the rounds' p50s.

    .venv/bin/python bench/runtime_compare.py --baseline /path/to/other/checkout [--rounds 6] [--sequential 30]

A baseline tree is made with, for example, ``git worktree add`` or ``git archive <rev> | tar -x``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
MODES = ("sequential", "exec", "stop")


def _one_run(tree: Path, sequential: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, str(tree / "bench" / "runtime.py"), "--sequential", str(sequential)]
    argv += ["--concurrency", "1", "--rounds", "1", "--idle", "1"]
    done = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True, check=True)
    p50s: dict[str, float] = {}
    for line in done.stdout.splitlines():
        row = json.loads(line)
        if row.get("mode") in MODES:
            p50s[row["mode"]] = float(row["p50_ms"])
    return p50s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--baseline", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sequential", type=int, default=30)
    args = parser.parse_args()
    sides = {"baseline": args.baseline.resolve(), "this": HERE}
    collected: dict[str, dict[str, list[float]]] = {side: {m: [] for m in MODES} for side in sides}
    for round_no in range(args.rounds):
        # Alternate which side goes first, so a load that rises or falls does not favour one.
        order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
        for side in order:
            p50s = _one_run(sides[side], args.sequential)
            for mode, value in p50s.items():
                collected[side][mode].append(value)
            print(
                json.dumps({"bench": "runtime_compare", "round": round_no, "side": side, **p50s}), flush=True
            )
    for mode in MODES:
        base = statistics.median(collected["baseline"][mode])
        this = statistics.median(collected["this"][mode])
        summary = {"bench": "runtime_compare", "mode": mode, "baseline_p50_ms": base, "this_p50_ms": this}
        print(json.dumps({**summary, "ratio": round(this / base, 3) if base else None}))


if __name__ == "__main__":
    main()
