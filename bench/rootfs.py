"""Image sandboxes beside host-root ones, in one run: create -> first exec from a cached image (its
erofs already mounted, the disk pool filled) against today's host-root create; and the host disk one
image sandbox takes. Prints one JSON object per line.

    .venv/bin/python bench/rootfs.py [--n 30] [--disk-mb 256]

Needs root, bubblewrap and the image tools (make system-deps). Bar: image p50 <= 2 x host-root p50
and <= 50 ms.
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

from corral.images.digest import digest_file
from corral.runtime.base import SandboxSpec
from corral.runtime.cgroups import detect
from corral.runtime.process import ProcessRuntime, unavailable_reason
from corral.testing.erofs import small_image
from corral.testing.resolver import DictResolver


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def _create_to_exec(runtime: ProcessRuntime, spec: SandboxSpec) -> float:
    started = time.perf_counter()
    await runtime.start(spec)
    done = await runtime.exec(spec.id, ["true"])
    elapsed = (time.perf_counter() - started) * 1000
    assert done.exit_code == 0, done
    return elapsed


async def _run(n: int, disk_mb: int) -> list[dict[str, object]]:
    image = small_image()
    digest = digest_file(image)
    cgroups = detect(f"corral-bench-rootfs-{uuid.uuid4().hex[:8]}")
    lines: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="corral-bench-rootfs-") as work:
        runtime = ProcessRuntime(
            Path(work) / "sandboxes",
            cgroup_root=cgroups,
            images=DictResolver({digest: image}),
            disk_root=Path(work) / "disks",
            disk_pool_depth=4,
        )
        # Warm: the image mounted by a first sandbox, the pool filled, the launcher built.
        await _create_to_exec(
            runtime, SandboxSpec(id="warm-image", memory_mb=256, image=digest, disk_mb=disk_mb)
        )
        await _create_to_exec(runtime, SandboxSpec(id="warm-host", memory_mb=256))
        await runtime.stop("warm-host")
        samples: dict[str, list[float]] = {"host-root": [], "image": []}
        for i in range(n):
            # Interleaved, so both kinds see the same machine; the pool refills between image creates.
            await runtime.fill_disks(disk_mb)
            for mode in ("host-root", "image"):
                sid = f"{mode}-{i}"
                spec = SandboxSpec(id=sid, memory_mb=256)
                if mode == "image":
                    spec = SandboxSpec(id=sid, memory_mb=256, image=digest, disk_mb=disk_mb)
                samples[mode].append(await _create_to_exec(runtime, spec))
                await runtime.stop(sid)
        for mode, ms in samples.items():
            lines.append(
                {
                    "bench": "rootfs",
                    "mode": mode,
                    "n": len(ms),
                    "p50_ms": round(statistics.median(ms), 2),
                    "p99_ms": round(_percentile(ms, 0.99), 2),
                }
            )
        ratio = statistics.median(samples["image"]) / statistics.median(samples["host-root"])
        lines.append(
            {
                "bench": "rootfs",
                "mode": "image-vs-host-root",
                "p50_ratio": round(ratio, 2),
                "bar": "image p50 <= 2 x host-root p50 and <= 50 ms",
                "met": ratio <= 2 and statistics.median(samples["image"]) <= 50,
            }
        )
        disk = Path(work) / "disks" / "warm-image.img"
        lines.append(
            {
                "bench": "rootfs",
                "mode": "disk",
                "disk_mb": disk_mb,
                "image_mb": round(image.stat().st_size / 2**20, 1),
                "allocated_mb_idle_sandbox": round(disk.stat().st_blocks * 512 / 2**20, 2),
            }
        )
        await runtime.stop("warm-image")
    if cgroups is not None:
        cgroups.remove_if_empty()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--disk-mb", type=int, default=256)
    args = parser.parse_args()
    reason = unavailable_reason() or (None if os.geteuid() == 0 else "image sandboxes need root")
    if reason is not None:
        print(json.dumps({"bench": "rootfs", "skipped": reason}))
        return
    for line in asyncio.run(_run(args.n, args.disk_mb)):
        print(json.dumps(line))


if __name__ == "__main__":
    main()
