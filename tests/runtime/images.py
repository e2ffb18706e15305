"""What the image sandboxes' tests share: the small base as an image (built once per machine), a
runtime factory whose runtimes resolve it, and the host-side checks that nothing of a sandbox's root
is left behind."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.images.digest import digest_file
from corral.runtime.process import ProcessRuntime
from corral.runtime.statedir import Running
from corral.testing.erofs import small_image
from corral.testing.resolver import DictResolver
from tests.runtime.conftest import RuntimeFactory


@dataclass(frozen=True)
class Image:
    digest: str
    path: Path


def base_image() -> Image:
    path = small_image()
    return Image(digest_file(path), path)


def image_runtime(
    make: RuntimeFactory, tmp_path: Path, resolver: DictResolver, **kwargs: Any
) -> ProcessRuntime:
    kwargs.setdefault("disk_root", tmp_path / "disks")
    return make(images=resolver, **kwargs)


def mount_lines(*under: Path) -> list[str]:
    """Mounts at or below any of ``under`` (by the mount point, /proc/self/mountinfo's fifth field)."""
    prefixes = [os.fsencode(p) for p in under]
    lines = Path("/proc/self/mountinfo").read_bytes().splitlines()
    return [
        line.decode(errors="replace")
        for line in lines
        if any(line.split(b" ")[4] == p or line.split(b" ")[4].startswith(p + b"/") for p in prefixes)
    ]


def loops_backed_by(*under: Path) -> list[str]:
    """Loop devices whose backing file lies under any of ``under``."""
    found = []
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        text = backing.read_text().strip()
        if any(text == str(p) or text.startswith(f"{p}/") for p in under):
            found.append(f"{backing.parent.parent.name}: {text}")
    return found


def outside_pool(lines: list[str], disks: Path) -> list[str]:
    """Those of ``lines`` (mounts or loop devices) that are not of the ready disks of the pool under
    ``disks``, which stay mounted until the runtime drains its pool."""
    return [line for line in lines if f"{disks}/.pool/ready-" not in line]


def base_uid(runtime: ProcessRuntime, sandbox_id: str) -> int:
    record = runtime.statedir.load(sandbox_id)
    assert isinstance(record, Running) and record.uid is not None
    return record.uid


def host_uids(pid: int) -> list[int]:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(v) for v in line.split()[1:]]
    raise AssertionError(f"no Uid line for {pid}")
