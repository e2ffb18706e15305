"""The pool of writable disks image sandboxes take: a drained pool makes one there and then, a disk is
made fresh for one sandbox and never handed out twice, and a fresh disk costs the host next to nothing
of its own disk."""

from __future__ import annotations

import shutil
import struct
from pathlib import Path

import pytest

from corral.runtime.rootfs import DiskPool
from tests.ci import require

_MIB = 1024 * 1024
_EXT_MAGIC = 0xEF53


@pytest.fixture(autouse=True)
def _mkfs() -> None:
    require(None if shutil.which("mkfs.ext4") else "the disk pool needs mkfs.ext4 (e2fsprogs)")


def _is_ext4(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(1024 + 56)  # the superblock's s_magic
        return struct.unpack("<H", f.read(2))[0] == _EXT_MAGIC


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def test_a_drained_pool_makes_a_disk_on_demand(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=0)  # never filled ahead: every take finds it drained
    assert pool.fill() == 0
    target = tmp_path / "a.img"
    assert pool.take(32, target) is False
    assert target.stat().st_size == 32 * _MIB and _is_ext4(target)
    assert pool.ready(32) == []


def test_a_filled_pool_hands_out_each_disk_once_and_never_a_used_one(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=2)
    pool.note(32)
    assert pool.fill() == 2
    ready = {p.name for p in pool.ready(32)}
    first = tmp_path / "first.img"
    assert pool.take(32, first) is True
    # What a sandbox leaves on its disk, then the disk deleted with it (as a teardown does).
    with first.open("r+b") as disk:
        disk.seek(8 * _MIB)
        disk.write(b"secret of the first sandbox")
    first.unlink()
    assert pool.fill() == 1
    refilled = {p.name for p in pool.ready(32)}
    assert len(refilled - ready) == 1  # a new disk, not the used one put back
    pooled = []
    for n in range(3):  # two from the pool, then one made on demand
        target = tmp_path / f"next-{n}.img"
        pooled.append(pool.take(32, target))
        assert b"secret" not in target.read_bytes()
        assert _is_ext4(target)
    assert pooled == [True, True, False]


def test_a_fresh_disk_takes_little_of_the_hosts_disk(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=0)
    target = tmp_path / "big.img"
    pool.take(1024, target)
    # A sparse file: a 1 GiB disk holds only its file system's few metadata blocks (no journal, no
    # blocks reserved for growth), so hundreds of idle sandboxes cost the host little beside the image.
    assert target.stat().st_size == 1024 * _MIB
    assert _allocated(target) <= 192 * 1024


def test_disks_a_killed_fill_left_half_made_go_at_the_next_open(tmp_path: Path) -> None:
    directory = tmp_path / "pool"
    directory.mkdir()
    stale = directory / ".making-999999999-1-0"  # a pid that cannot be alive
    stale.write_bytes(b"half a disk")
    DiskPool(directory)
    assert not stale.exists()
