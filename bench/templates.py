"""Template builds: a cold build beside a rebuild with only the last step changed (bar: the rebuild
<= 10 s), in one run on one machine. Prints one JSON object per line.

    .venv/bin/python bench/templates.py [--base python] [--network] [--rounds 3] [--sandboxes] [--disk-mb 1024]

``--base python --network`` is Debian + python3 and a pip package (its steps reach the package index,
trusting the host's CA bundle as a tenant's build does); without ``--network`` (any base) the steps
are offline ones (a file written, 8 MiB of data) and need no network. The base
tarball is built once per machine (mmdebstrap; its time is printed when it is built here). A cold
build starts from an empty layer cache (the base unpacked, every step run, the image packed); a
rebuild changes the last step only.

``--sandboxes``: then bench/rootfs.py's image-sandbox figures (create -> first exec beside a host-root
create, the first create on a host without the image, the disk of 200 sandboxes) on the image built.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import rootfs  # bench/rootfs.py, beside this file

from corral.control.builds import build_limits
from corral.images.bases import BASES, Bases, canonical, debootstrap
from corral.images.builder import Builder
from corral.images.dirstore import DirBlobStore
from corral.images.recipe import parse
from corral.runtime.rootfs import DEFAULT_DISK_MB

PYTHON_RECIPE = """\
FROM python
RUN pip install --break-system-packages --no-cache-dir six
RUN echo {stamp} > /stamp
"""
OFFLINE_RECIPE = """\
FROM {base}
RUN echo 'print(1)' > /app.py && mkdir -p /opt/data && head -c 8M /dev/urandom > /opt/data/blob
RUN echo {stamp} > /stamp
"""
BAR_REBUILD_S = 10.0


def _cache() -> Path:
    root = Path(os.environ.get("CORRAL_BENCH_CACHE") or Path.home() / ".cache" / "corral-bench")
    root.mkdir(parents=True, exist_ok=True)
    return root


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base", default="python")
    parser.add_argument("--network", action="store_true", help="steps share the host's network")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sandboxes", action="store_true", help="then image sandboxes of the image built")
    parser.add_argument("--disk-mb", type=int, default=DEFAULT_DISK_MB, help="each image sandbox's disk")
    args = parser.parse_args()
    base = canonical(args.base)
    if base is None:
        raise SystemExit(f"unknown base {args.base!r}: one of {sorted(BASES)}")
    spec = BASES[base]
    tarball = _cache() / spec.file_name()
    if not tarball.exists():
        started = time.monotonic()
        await asyncio.to_thread(debootstrap, tarball, spec)
        print(
            json.dumps(
                {"bench": "base_tarball", "base": base, "seconds": round(time.monotonic() - started, 2)}
            )
        )
    text = PYTHON_RECIPE if base == "python" and args.network else OFFLINE_RECIPE
    # As a tenant's build: with the network, the host's CA bundle is trusted inside (a proxy's CA).
    limits = build_limits(network=args.network)
    with tempfile.TemporaryDirectory(prefix="corral-bench-templates-") as tmp:
        root = Path(tmp)
        builder = Builder(root / "builder", DirBlobStore(root / "blobs"), Bases(_cache(), {base: tarball}))
        for n in range(args.rounds):
            shutil.rmtree(root / "builder", ignore_errors=True)
            builder = Builder(
                root / "builder", DirBlobStore(root / "blobs"), Bases(_cache(), {base: tarball})
            )
            started = time.monotonic()
            cold = await builder.build(parse(text.format(base=base, stamp=f"cold-{n}")), limits=limits)
            cold_s = time.monotonic() - started
            started = time.monotonic()
            warm = await builder.build(parse(text.format(base=base, stamp=f"rebuilt-{n}")), limits=limits)
            rebuild_s = time.monotonic() - started
            print(
                json.dumps(
                    {
                        "bench": "build",
                        "base": base,
                        "network": args.network,
                        "round": n,
                        "cold_s": round(cold_s, 2),
                        "rebuild_last_step_changed_s": round(rebuild_s, 2),
                        "rebuild_steps_run": warm.steps_run,
                        "rebuild_steps_cached": warm.steps_cached,
                        "image_mb": round(warm.size_bytes / 2**20, 1),
                        "bar_rebuild_s": BAR_REBUILD_S,
                        "rebuild_within_bar": rebuild_s <= BAR_REBUILD_S,
                        "digests_differ": cold.digest != warm.digest,
                    }
                )
            )
        if args.sandboxes:
            reason = rootfs.skipped()
            if reason is not None:
                print(json.dumps({"bench": "rootfs", "skipped": reason}))
                return
            image = DirBlobStore(root / "blobs").path(warm.digest)
            for line in await rootfs.run(
                image, n=30, disk_mb=args.disk_mb, fetches=3, dense=200, write_kib=1024
            ):
                print(json.dumps({**line, "image": f"{base} + the recipe's steps"}))


if __name__ == "__main__":
    asyncio.run(main())
