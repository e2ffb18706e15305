"""Image sandboxes beside host-root ones, in one run. Prints one JSON object per line.

    .venv/bin/python bench/rootfs.py [--n 30] [--disk-mb 1024] [--fetches 3] [--density 200]
                                     [--write-kib 1024] [--gvisor 10] [--image FILE]

- ``rootfs``: create -> first exec from a cached image (its erofs already mounted, the disk pool
  filled) beside today's host-root create, interleaved. Bar: image p50 <= 2 x host-root p50 and
  <= 50 ms.
- ``gvisor``: the same create -> first exec on the gvisor runtime (``--gvisor`` rounds), an image's
  sandbox beside a host-root one, interleaved (skipped where runsc runs nothing).
- ``first-create``: the first create on a host without the image (fetched from the blob store of
  ``corral serve``, hashed, written, mounted) beside the next create once the file is cached (mount
  included: no sandbox of it is left running), on a fresh image cache each round.
- ``density``: the host disk ``--density`` sandboxes of one image take (the image once, a disk each,
  every sandbox having written ``--write-kib`` to its root) beside ``--density`` x the image. Bar:
  < 1.2 x (one image + what their writable layers hold).

``--image``: an erofs image file (bench/templates.py passes the image it built); by default the test
suite's small base. Needs root, bubblewrap and the image tools (make system-deps).
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

from corral.images.cache import DEFAULT_IMAGE_CACHE_MB, ImageCache
from corral.images.digest import digest_file
from corral.images.dirstore import DirBlobStore
from corral.runtime.base import SandboxSpec
from corral.runtime.cgroups import CgroupRoot, detect
from corral.runtime.gvisor import GvisorRuntime
from corral.runtime.gvisor import unavailable_reason as gvisor_unavailable
from corral.runtime.process import ProcessRuntime, unavailable_reason
from corral.runtime.rootfs import DEFAULT_DISK_MB
from corral.testing.erofs import small_image
from corral.testing.resolver import DictResolver

_MIB = 2**20
BAR_DENSITY = 1.2


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _allocated(path: Path) -> int:
    """Bytes a (sparse) file takes on the host's disk."""
    return path.stat().st_blocks * 512


def _mb(n: float) -> float:
    return round(n / _MIB, 2)


async def _create_to_exec(runtime: ProcessRuntime | GvisorRuntime, spec: SandboxSpec) -> float:
    started = time.perf_counter()
    await runtime.start(spec)
    done = await runtime.exec(spec.id, ["true"])
    elapsed = (time.perf_counter() - started) * 1000
    assert done.exit_code == 0, done
    return elapsed


async def _filled(runtime: ProcessRuntime | GvisorRuntime, disks: Path, disk_mb: int) -> None:
    """The pool holds a ready disk of ``disk_mb`` (a refill may be running in the background, and a
    fill then returns at once)."""
    await runtime.fill_disks(disk_mb)
    while not any((disks / ".pool").glob(f"ready-{disk_mb}m-*")):
        await asyncio.sleep(0.005)


async def create_beside_host_root(
    runtime: ProcessRuntime | GvisorRuntime,
    digest: str,
    disks: Path,
    n: int,
    disk_mb: int,
    bench: str = "rootfs",
    bar_ms: float | None = 50,
) -> list[dict[str, object]]:
    samples: dict[str, list[float]] = {"host-root": [], "image": []}
    for i in range(n):
        # Interleaved, so both kinds see the same machine; the pool refills between image creates.
        await _filled(runtime, disks, disk_mb)
        for mode in ("host-root", "image"):
            sid = f"{mode}-{i}"
            spec = SandboxSpec(id=sid, memory_mb=256)
            if mode == "image":
                spec = SandboxSpec(id=sid, memory_mb=256, image=digest, disk_mb=disk_mb)
            samples[mode].append(await _create_to_exec(runtime, spec))
            await runtime.stop(sid)
    lines: list[dict[str, object]] = [
        {
            "bench": bench,
            "mode": mode,
            "n": len(ms),
            "p50_ms": round(statistics.median(ms), 2),
            "p99_ms": round(_percentile(ms, 0.99), 2),
        }
        for mode, ms in samples.items()
    ]
    image_p50 = statistics.median(samples["image"])
    ratio = image_p50 / statistics.median(samples["host-root"])
    lines.append(
        {
            "bench": bench,
            "mode": "image-vs-host-root",
            "p50_ratio": round(ratio, 2),
            "bar": "image p50 <= 2 x host-root p50" + (f" and <= {bar_ms:g} ms" if bar_ms else ""),
            "met": ratio <= 2 and (bar_ms is None or image_p50 <= bar_ms),
        }
    )
    return lines


async def first_create(
    work: Path, image: Path, digest: str, cgroups: CgroupRoot | None, rounds: int, disk_mb: int
) -> dict[str, object]:
    """Each round: a runtime over an empty image cache, fed from a directory blob store (the
    transfer is a local copy: a remote host's would add the network's time)."""
    blobs = DirBlobStore(work / "blobs")
    await blobs.put(digest, image)
    cold: list[float] = []
    cached: list[float] = []
    fetches = 0
    for r in range(rounds):
        cache = ImageCache(work / f"cache-{r}", blobs, DEFAULT_IMAGE_CACHE_MB * _MIB)
        # A disk root of its own, as each state root has (a runtime reclaims the disks it has no record of).
        disks = work / f"disks-{r}"
        runtime = ProcessRuntime(work / f"fetch-{r}", cgroup_root=cgroups, images=cache, disk_root=disks)
        for kind, samples in (("cold", cold), ("cached", cached)):
            await _filled(runtime, disks, disk_mb)
            sid = f"fetch-{r}-{kind}"
            spec = SandboxSpec(id=sid, memory_mb=256, image=digest, disk_mb=disk_mb)
            samples.append(await _create_to_exec(runtime, spec))
            await runtime.stop(sid)
        await runtime.drain_disks()
        fetches += cache.fetches
    return {
        "bench": "rootfs",
        "mode": "first-create",
        "rounds": rounds,
        "image_mb": _mb(image.stat().st_size),
        "without_image_p50_ms": round(statistics.median(cold), 2),
        "without_image_max_ms": round(max(cold), 2),
        "cached_p50_ms": round(statistics.median(cached), 2),
        "cached_max_ms": round(max(cached), 2),
        "fetches": fetches,
    }


async def density(
    runtime: ProcessRuntime, image: Path, digest: str, disks: Path, count: int, disk_mb: int, write_kib: int
) -> dict[str, object]:
    ids = [f"dense-{i}" for i in range(count)]
    started = time.perf_counter()
    try:
        for sid in ids:
            await runtime.start(SandboxSpec(id=sid, memory_mb=64, image=digest, disk_mb=disk_mb))
            wrote = await runtime.exec(sid, ["sh", "-c", f"head -c {write_kib}K /dev/urandom > ~/written"])
            assert wrote.exit_code == 0, wrote
        create_s = time.perf_counter() - started
        os.sync()  # the writes reach the disks' files (delayed allocation would hide them)
        # What each writable layer holds, as its own filesystem counts it (data and metadata).
        held = 0
        for sid in ids:
            fs = os.statvfs(runtime._root_paths(sid).disk_mnt)
            held += (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        disks_alloc = sum(_allocated(runtime._root_paths(sid).disk) for sid in ids)
    finally:
        for sid in ids:
            if runtime.statedir.load(sid) is not None:
                await runtime.stop(sid)
    image_alloc = _allocated(image)
    host = image_alloc + disks_alloc
    bound = image_alloc + held
    return {
        "bench": "rootfs",
        "mode": "density",
        "sandboxes": count,
        "disk_mb": disk_mb,
        "written_kib_each": write_kib,
        "create_and_write_s": round(create_s, 1),
        "image_mb": _mb(image_alloc),
        "layers_hold_mb": _mb(held),
        "disks_allocated_mb": _mb(disks_alloc),
        "disk_allocated_kib_each": round(disks_alloc / count / 1024, 1),
        "host_mb": _mb(host),
        "image_per_sandbox_mb": _mb(count * image.stat().st_size + disks_alloc),
        "ratio_to_image_plus_layers": round(host / bound, 3),
        "bar": f"host < {BAR_DENSITY} x (one image + what the layers hold)",
        "met": host < BAR_DENSITY * bound,
    }


async def on_gvisor(
    work: Path, digest: str, image: Path, cgroups: CgroupRoot | None, n: int, disk_mb: int
) -> list[dict[str, object]]:
    """``create_beside_host_root`` on gVisor: its bar is the ratio alone (a gVisor create is hundreds
    of ms, image or not)."""
    disks = work / "gvisor-disks"
    runtime = GvisorRuntime(
        work / "gvisor", cgroup_root=cgroups, images=DictResolver({digest: image}), disk_root=disks
    )
    try:
        await _create_to_exec(
            runtime, SandboxSpec(id="warm-gv", memory_mb=256, image=digest, disk_mb=disk_mb)
        )
        return await create_beside_host_root(
            runtime, digest, disks, n, disk_mb, bench="rootfs-gvisor", bar_ms=None
        )
    finally:
        for handle in await runtime.list():
            await runtime.stop(handle.id)
        await runtime.drain_disks()


async def run(
    image: Path, *, n: int, disk_mb: int, fetches: int, dense: int, write_kib: int, gvisor: int = 0
) -> list[dict[str, object]]:
    digest = digest_file(image)
    cgroups = detect(f"corral-bench-rootfs-{uuid.uuid4().hex[:8]}")
    lines: list[dict[str, object]] = []
    # On a disk (/tmp is a tmpfs on many hosts): the density figures are blocks a disk allocates.
    with tempfile.TemporaryDirectory(prefix="corral-bench-rootfs-", dir="/var/tmp") as tmp:
        work = Path(tmp)
        disks = work / "disks"
        runtime = ProcessRuntime(
            work / "sandboxes",
            cgroup_root=cgroups,
            images=DictResolver({digest: image}),
            disk_root=disks,
            disk_pool_depth=4,
        )
        try:
            # Warm: the image mounted by a first sandbox, the pool filled, the launcher built.
            warm = SandboxSpec(id="warm-image", memory_mb=256, image=digest, disk_mb=disk_mb)
            await _create_to_exec(runtime, warm)
            await _create_to_exec(runtime, SandboxSpec(id="warm-host", memory_mb=256))
            await runtime.stop("warm-host")
            if n:
                lines += await create_beside_host_root(runtime, digest, disks, n, disk_mb)
            idle = _allocated(runtime._root_paths("warm-image").disk)
            lines.append(
                {
                    "bench": "rootfs",
                    "mode": "disk",
                    "disk_mb": disk_mb,
                    "image_mb": _mb(image.stat().st_size),
                    "allocated_mb_idle_sandbox": _mb(idle),
                }
            )
            if dense:
                lines.append(await density(runtime, image, digest, disks, dense, disk_mb, write_kib))
            await runtime.stop("warm-image")
            if fetches:
                lines.append(await first_create(work, image, digest, cgroups, fetches, disk_mb))
            if gvisor and gvisor_unavailable() is None:
                lines += await on_gvisor(work, digest, image, cgroups, gvisor, disk_mb)
        finally:
            for handle in await runtime.list():
                await runtime.stop(handle.id)
            await runtime.drain_disks()
    if cgroups is not None:
        cgroups.remove_if_empty()
    return lines


def skipped() -> str | None:
    """Why image sandboxes cannot run here (None: they can)."""
    return unavailable_reason() or (None if os.geteuid() == 0 else "image sandboxes need root")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=30)
    parser.add_argument("--disk-mb", type=int, default=DEFAULT_DISK_MB)
    parser.add_argument("--fetches", type=int, default=3)
    parser.add_argument("--density", type=int, default=200)
    parser.add_argument("--write-kib", type=int, default=1024)
    parser.add_argument("--gvisor", type=int, default=10)
    parser.add_argument("--image", type=Path, help="an erofs image file (default: the small base)")
    args = parser.parse_args()
    reason = skipped()
    if reason is not None:
        print(json.dumps({"bench": "rootfs", "skipped": reason}))
        return
    lines = asyncio.run(
        run(
            args.image or small_image(),
            n=args.n,
            disk_mb=args.disk_mb,
            fetches=args.fetches,
            dense=args.density,
            write_kib=args.write_kib,
            gvisor=args.gvisor,
        )
    )
    for line in lines:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
