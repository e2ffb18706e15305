"""The pool of writable disks image sandboxes take: each disk attached and mounted ahead, a drained
pool makes one there and then, a disk is made fresh for one sandbox and never handed out twice, a
fresh disk costs the host next to nothing of its own disk, and the disks of a maker that is gone
(a crash, a restart) leave no mount and no loop device."""

from __future__ import annotations

import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from corral.runtime import rootfs
from corral.runtime.rootfs import DiskPool
from tests.ci import require
from tests.runtime.images import loops_backed_by, mount_lines

_MIB = 1024 * 1024
_EXT_MAGIC = 0xEF53
_DEAD_PID = "999999999"  # above any pid_max: never alive


@pytest.fixture(autouse=True)
def _mkfs() -> None:
    require(None if shutil.which("mkfs.ext4") else "the disk pool needs mkfs.ext4 (e2fsprogs)")
    require(None if os.geteuid() == 0 else "the disk pool mounts its disks: it needs root")


def _is_ext4(path: Path) -> bool:
    with path.open("rb") as f:
        f.seek(1024 + 56)  # the superblock's s_magic
        return struct.unpack("<H", f.read(2))[0] == _EXT_MAGIC


def _allocated(path: Path) -> int:
    return path.stat().st_blocks * 512


def _paths(target: Path) -> rootfs.RootPaths:
    return rootfs.RootPaths(target.parent, target.parent / "entry", target)


def _mounted_ext4(target: Path) -> bool:
    """``target``'s disk file is an ext4 file system mounted at its mount point, writable."""
    paths = _paths(target)
    lines = mount_lines(paths.disk_mnt)
    return _is_ext4(paths.disk) and len(lines) == 1 and " ext4 " in lines[0] and " rw," in lines[0]


def _cleanup(*targets: Path) -> None:
    for target in targets:
        rootfs.remove_disk(target)


def test_a_drained_pool_makes_a_mounted_disk_on_demand(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=0)  # never filled ahead: every take finds it drained
    assert pool.fill() == 0
    target = tmp_path / "a.disk"
    try:
        assert pool.take(32, target) is False
        assert _paths(target).disk.stat().st_size == 32 * _MIB and _mounted_ext4(target)
        assert pool.ready(32) == []
    finally:
        _cleanup(target)
    assert mount_lines(tmp_path) == [] and loops_backed_by(tmp_path) == []


def test_pool_disks_are_mounted_when_taken_and_two_never_share_one(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=2)
    pool.note(32)
    assert pool.fill() == 2
    # Made ahead means mounted ahead: the loop device and the mount are not a create's cost.
    assert all(len(mount_lines(ready / "mnt")) == 1 for ready in pool.ready(32))
    targets = [tmp_path / "first.disk", tmp_path / "second.disk"]
    try:
        assert [pool.take(32, t) for t in targets] == [True, True]
        assert all(_mounted_ext4(t) for t in targets)
        devices = {os.stat(_paths(t).disk_mnt).st_dev for t in targets}
        assert len(devices) == 2  # two file systems
        loops = loops_backed_by(*targets)
        assert len(loops) == 2 and len({line.split(":")[0] for line in loops}) == 2, loops
        # What one writes is not on the other's disk.
        (_paths(targets[0]).disk_mnt / "mine").write_text("first")
        assert not (_paths(targets[1]).disk_mnt / "mine").exists()
        assert pool.ready(32) == []
    finally:
        _cleanup(*targets)
    assert loops_backed_by(tmp_path / "first.disk", tmp_path / "second.disk") == []


def test_two_takers_at_once_over_one_ready_disk_get_one_each(tmp_path: Path) -> None:
    # Two pools over one directory (two runtimes of one root), racing for its one ready disk.
    first = DiskPool(tmp_path / "pool", depth=1)
    first.note(32)
    assert first.fill() == 1
    second = DiskPool(tmp_path / "pool", depth=1)
    targets = [tmp_path / "a.disk", tmp_path / "b.disk"]
    try:
        with ThreadPoolExecutor(2) as threads:
            taken = list(threads.map(lambda pool, target: pool.take(32, target), (first, second), targets))
        assert sorted(taken) == [False, True]  # one from the pool, one made there and then
        assert all(_mounted_ext4(t) for t in targets)
        assert len({os.stat(_paths(t).disk_mnt).st_dev for t in targets}) == 2
    finally:
        _cleanup(*targets)


def test_a_filled_pool_hands_out_each_disk_once_and_never_a_used_one(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=2)
    pool.note(32)
    assert pool.fill() == 2
    ready = {p.name for p in pool.ready(32)}
    first = tmp_path / "first.disk"
    assert pool.take(32, first) is True
    # What a sandbox leaves on its disk, then the disk deleted with it (as a teardown does).
    (_paths(first).disk_mnt / "left").write_bytes(b"secret of the first sandbox")
    _cleanup(first)
    assert not first.exists()
    assert pool.fill() == 1
    refilled = {p.name for p in pool.ready(32)}
    assert len(refilled - ready) == 1  # a new disk, not the used one put back
    pooled = []
    targets = [tmp_path / f"next-{n}.disk" for n in range(3)]
    try:
        for target in targets:  # two from the pool, then one made on demand
            pooled.append(pool.take(32, target))
            assert os.listdir(_paths(target).disk_mnt) == ["lost+found"]
            assert _mounted_ext4(target)
    finally:
        _cleanup(*targets)
    assert pooled == [True, True, False]


def test_a_fresh_disk_takes_little_of_the_hosts_disk(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=0)
    target = tmp_path / "big.disk"
    try:
        pool.take(1024, target)
        # A sparse file: a 1 GiB disk holds only its file system's few metadata blocks (no journal,
        # no blocks reserved for growth), mounted or not, so hundreds of idle sandboxes cost the host
        # little beside the image.
        disk = _paths(target).disk
        assert disk.stat().st_size == 1024 * _MIB
        assert _allocated(disk) <= 192 * 1024
    finally:
        _cleanup(target)


def test_the_disks_of_a_maker_that_is_gone_leave_no_mount_or_loop_device(tmp_path: Path) -> None:
    directory = tmp_path / "pool"
    pool = DiskPool(directory, depth=3)
    pool.note(32)
    assert pool.fill() == 3
    # What a killed agent leaves: a disk half made (mounted, not yet ready), ready ones (mounted), and
    # one whose mount a host restart took away. Their names say their maker: a pid that is not alive.
    first, second, third = pool.ready(32)
    os.rename(first, directory / f".making-{_DEAD_PID}-1-0")
    os.rename(second, directory / f"ready-32m-{_DEAD_PID}-1-1")
    rootfs._umount(third / "mnt")
    os.rename(third, directory / f"ready-32m-{_DEAD_PID}-1-2")
    stale = directory / f".making-{_DEAD_PID}-1-3"  # killed before its file system was made
    stale.mkdir()
    (stale / "disk.img").write_bytes(b"half a disk")
    (directory / f"ready-32m-{_DEAD_PID}-1-4").write_bytes(
        b""
    )  # a file alone: made before disks were mounted
    assert len(mount_lines(directory)) == 2 and len(loops_backed_by(directory)) == 2
    # Another pool (a restarted agent) opened over the directory: everything of the dead maker goes.
    again = DiskPool(directory, depth=1)
    assert mount_lines(directory) == [] and loops_backed_by(directory) == []
    assert list(directory.iterdir()) == []
    # And a disk the live maker holds ready stays, mounted.
    again.note(32)
    assert again.fill() == 1
    DiskPool(directory)
    assert len(again.ready(32)) == 1 and len(mount_lines(directory)) == 1
    _cleanup(*again.ready(32))


def test_a_ready_disk_whose_mount_went_is_mounted_when_taken(tmp_path: Path) -> None:
    pool = DiskPool(tmp_path / "pool", depth=1)
    pool.note(32)
    pool.fill()
    (ready,) = pool.ready(32)
    rootfs._umount(ready / "mnt")  # as a host restart before any reclaim leaves it
    target = tmp_path / "t.disk"
    try:
        assert pool.take(32, target) is True
        assert _mounted_ext4(target)
    finally:
        _cleanup(target)
