"""Process-runtime benchmark: create-to-first-exec latency (sequential and concurrent) and the host
memory each idle sandbox costs. Prints one JSON object per line.

    .venv/bin/python bench/runtime.py [--sequential 50] [--concurrency 8] [--rounds 5] [--idle 20]

Needs what the runtime needs (bubblewrap, root for the cgroup); bar: create-to-first-exec p50 <= 50 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

from corral.runtime import procfs
from corral.runtime.base import SandboxSpec
from corral.runtime.cgroups import detect
from corral.runtime.process import ProcessRuntime, unavailable_reason
from corral.runtime.statedir import Running


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _summary(mode: str, samples_ms: list[float], **extra: object) -> dict[str, object]:
    return {
        "bench": "runtime",
        "mode": mode,
        "n": len(samples_ms),
        "p50_ms": round(statistics.median(samples_ms), 2),
        "p99_ms": round(_percentile(samples_ms, 0.99), 2),
        "max_ms": round(max(samples_ms), 2),
        **extra,
    }


async def _create_to_first_exec(runtime: ProcessRuntime, sandbox_id: str) -> float:
    started = time.perf_counter()
    await runtime.start(SandboxSpec(id=sandbox_id, memory_mb=256))
    result = await runtime.exec(sandbox_id, ["true"])
    elapsed = (time.perf_counter() - started) * 1000.0
    if result.exit_code != 0:
        raise RuntimeError(f"first exec failed: {result.stderr}")
    return elapsed


def _pss_mb(runtime: ProcessRuntime, sandbox_id: str) -> float:
    """User-space memory of every process of the sandbox (bubblewrap's monitor included), shared
    pages split among their users: what the host pays per sandbox, read directly rather than as a
    host-wide difference that neighbours' activity would swamp."""
    record = runtime.statedir.load(sandbox_id)
    if not isinstance(record, Running) or record.cgroup is None:
        return 0.0
    pids = [int(pid) for pid in (Path(record.cgroup) / "cgroup.procs").read_text().split()]
    return sum(procfs.proportional_kib(pid) for pid in pids) / 1024


async def run(sequential: int, concurrency: int, rounds: int, idle: int) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    cgroups = detect(f"corral-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as root:
        runtime = ProcessRuntime(Path(root), cgroup_root=cgroups)
        try:
            # Warm the page cache for bwrap, nsenter and sleep so the first sample is not an outlier.
            await _create_to_first_exec(runtime, "warm")
            await runtime.stop("warm")

            samples = []
            stops = []
            for i in range(sequential):
                samples.append(await _create_to_first_exec(runtime, f"seq-{i}"))
                started = time.perf_counter()
                await runtime.stop(f"seq-{i}")
                stops.append((time.perf_counter() - started) * 1000.0)
            results.append(_summary("sequential", samples))
            results.append(_summary("stop", stops))

            samples = []
            for r in range(rounds):
                ids = [f"conc-{r}-{i}" for i in range(concurrency)]
                samples += await asyncio.gather(*(_create_to_first_exec(runtime, sid) for sid in ids))
                await asyncio.gather(*(runtime.stop(sid) for sid in ids))
            results.append(_summary("concurrent", samples, concurrency=concurrency, rounds=rounds))

            samples = []
            await runtime.start(SandboxSpec(id="exec", memory_mb=256))
            for _ in range(sequential):
                started = time.perf_counter()
                await runtime.exec("exec", ["true"])
                samples.append((time.perf_counter() - started) * 1000.0)
            await runtime.stop("exec")
            results.append(_summary("exec", samples))

            ids = [f"idle-{i}" for i in range(idle)]
            for sid in ids:
                await runtime.start(SandboxSpec(id=sid, memory_mb=256))
            resident = [await runtime.resident_mb(sid) or 0 for sid in ids]
            pss = [_pss_mb(runtime, sid) for sid in ids]
            for sid in ids:
                await runtime.stop(sid)
            results.append(
                {
                    "bench": "runtime",
                    "mode": "overhead",
                    "n": idle,
                    "pss_mb_per_sandbox": round(statistics.mean(pss), 2),
                    "cgroup_mb_per_sandbox": round(statistics.mean(resident), 2),
                    "cgroup": cgroups is not None,
                }
            )
        finally:
            for handle in await runtime.list():
                await runtime.stop(handle.id)
            if cgroups is not None:
                cgroups.remove_if_empty()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sequential", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=int, default=20)
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(json.dumps({"bench": "runtime", "skipped": reason}))
        return
    for line in asyncio.run(run(args.sequential, args.concurrency, args.rounds, args.idle)):
        print(json.dumps(line))


if __name__ == "__main__":
    main()
