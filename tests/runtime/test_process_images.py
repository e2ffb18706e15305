"""Image sandboxes: an overlay root of the image over a disk of their own, root inside through sudo
and a range of host uids outside, torn down to the last mount and loop device."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from corral.runtime import commands
from corral.runtime.base import InvalidSandbox, SandboxSpec
from corral.runtime.process import ProcessRuntime
from corral.runtime.rootfs import disk_path
from corral.runtime.uids import DEFAULT_UID_RANGES, RANGE_SPAN
from corral.testing.resolver import DictResolver
from tests.runtime.conftest import RuntimeFactory
from tests.runtime.images import (
    Image,
    base_image,
    base_uid,
    host_uids,
    image_runtime,
    loops_backed_by,
    mount_lines,
    outside_pool,
)

pytestmark = pytest.mark.process
_MIB = 1024 * 1024


@pytest.fixture(scope="session")
def image() -> Image:
    return base_image()


@pytest.fixture
def resolver(image: Image) -> DictResolver:
    return DictResolver({image.digest: image.path})


@pytest.fixture
def runtime(make_process_runtime: RuntimeFactory, tmp_path: Path, resolver: DictResolver) -> ProcessRuntime:
    return image_runtime(make_process_runtime, tmp_path, resolver)


def _spec(base: Image, sandbox_id: str, **kwargs: object) -> SandboxSpec:
    kwargs.setdefault("image", base.digest)
    return SandboxSpec(id=sandbox_id, memory_mb=256, **kwargs)  # type: ignore[arg-type]


async def test_sudo_is_root_inside_and_the_sandbox_range_outside(
    runtime: ProcessRuntime, image: Image
) -> None:
    await runtime.start(_spec(image, "img-sudo", disk_mb=64))
    whoami = await runtime.exec("img-sudo", ["sh", "-c", "id -un; id -u; pwd; echo $HOME"])
    assert whoami.stdout.split() == ["user", "1000", "/home/user", "/home/user"], whoami
    sudo = await runtime.exec("img-sudo", ["sudo", "id", "-u"])
    assert (sudo.exit_code, sudo.stdout.strip()) == (0, "0"), sudo
    base = base_uid(runtime, "img-sudo")
    assert base in DEFAULT_UID_RANGES and base % RANGE_SPAN == 0
    # A root process inside, seen from the host: the range's first uid, never 0.
    sleeper = await runtime.spawn("img-sudo", ["sudo", "sleep", "30"])
    try:
        procs = []
        for _ in range(200):
            procs = [p for p in _cgroup_pids(runtime, "img-sudo") if _comm(p) == "sleep"]
            if procs:
                break
            await asyncio.sleep(0.02)
        assert procs, "the sleep never showed up in the sandbox's cgroup"
        assert host_uids(procs[0]) == [base] * 4
        # Every process inside (the launcher's host-side parent of each exec aside), but the command
        # server, which is the host's (see test_image_commands.py).
        inside = [p for p in _cgroup_pids(runtime, "img-sudo") if _pid_ns(p) == _pid_ns(procs[0])]
        assert [host_uids(p) for p in inside if _comm(p) == commands.SERVER_NAME] == [[0] * 4]
        inside = [p for p in inside if _comm(p) != commands.SERVER_NAME]
        everything = {uid for p in inside for uid in host_uids(p)}
        assert everything and all(base <= uid < base + RANGE_SPAN for uid in everything), everything
        mapping = Path(f"/proc/{procs[0]}/uid_map").read_text().split()
        assert mapping == ["0", str(base), str(RANGE_SPAN)]
    finally:
        sleeper.signal(signal.SIGKILL)
        await sleeper.wait()
    # The sandbox's root has its own uid range: a file root makes inside is the range's on the disk.
    made = await runtime.exec("img-sudo", ["sudo", "touch", "/made-by-root"])
    assert made.exit_code == 0, made
    upper = runtime._root_paths("img-sudo").disk_mnt / "upper" / "made-by-root"
    assert (upper.stat().st_uid, upper.stat().st_gid) == (base, base)


def _cgroup_pids(runtime: ProcessRuntime, sandbox_id: str) -> list[int]:
    assert runtime.cgroups is not None
    procs = runtime.cgroups.child(sandbox_id).path / "cgroup.procs"
    return [int(p) for p in procs.read_text().split()]


def _pid_ns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


async def test_two_sandboxes_of_one_image_share_its_mount_and_not_their_writes(
    runtime: ProcessRuntime, image: Image, resolver: DictResolver
) -> None:
    await asyncio.gather(runtime.start(_spec(image, "img-a")), runtime.start(_spec(image, "img-b")))
    assert base_uid(runtime, "img-a") != base_uid(runtime, "img-b")
    write = await runtime.exec(
        "img-a", ["sh", "-c", "echo a > /home/user/mine && sudo sh -c 'echo a > /etc/mine'"]
    )
    assert write.exit_code == 0, write
    for path in ("/home/user/mine", "/etc/mine"):
        seen = await runtime.exec("img-b", ["cat", path])
        assert seen.exit_code == 1 and "No such file" in seen.stderr, seen
    listed = await runtime.exec("img-b", ["ls", "-A", "/home/user"])
    assert "mine" not in listed.stdout
    again = await runtime.exec("img-a", ["cat", "/home/user/mine", "/etc/mine"])
    assert again.stdout == "a\na\n"
    # One read-only mount of the image for both, the image file asked for once per sandbox.
    image_mounts = [line for line in mount_lines(runtime.statedir.root) if " erofs " in line]
    assert len(image_mounts) == 1, image_mounts
    assert resolver.held[image.digest] == 2
    await runtime.stop("img-a")
    assert len([line for line in mount_lines(runtime.statedir.root) if " erofs " in line]) == 1
    await runtime.stop("img-b")
    assert resolver.held[image.digest] == 0
    assert mount_lines(runtime.statedir.root) == []


async def test_enospc_at_disk_mb_and_the_host_keeps_its_free_space(
    runtime: ProcessRuntime, image: Image, tmp_path: Path
) -> None:
    disk_mb = 32
    await runtime.start(_spec(image, "img-full", disk_mb=disk_mb))
    disk = runtime._root_paths("img-full").disk
    before = _allocated(disk)
    fill = await runtime.exec(
        "img-full", ["sh", "-c", "dd if=/dev/urandom of=/home/user/big bs=1M count=256 2>&1; sync"]
    )
    assert "No space left on device" in fill.stdout, fill
    wrote = await runtime.exec("img-full", ["stat", "-c", "%s", "/home/user/big"])
    assert disk_mb * _MIB * 0.8 < int(wrote.stdout) <= disk_mb * _MIB
    # The host's disk gave the sandbox at most its cap (the sparse file's blocks), not the 256 MiB
    # asked, and held next to nothing of it before; everything the runtime keeps there is about that.
    assert before < 4 * _MIB
    assert _allocated(disk) <= disk_mb * _MIB
    # (The host's own file system: not what is inside the disks, mounted beneath.)
    host = os.stat(tmp_path).st_dev
    on_host = [p for p in (tmp_path / "disks").rglob("*") if p.is_file() and p.stat().st_dev == host]
    assert disk in on_host
    assert sum(_allocated(p) for p in on_host) <= (disk_mb + 8) * _MIB
    used = await runtime.disk_used_mb("img-full")
    assert used is not None and disk_mb * 0.8 < used <= disk_mb
    await runtime.stop("img-full")
    assert not disk.exists()


def _allocated(path: Path) -> int:
    """What a (sparse) file takes of the host's disk."""
    return path.stat().st_blocks * 512


async def test_nothing_of_a_root_outlives_its_sandbox(
    runtime: ProcessRuntime, image: Image, tmp_path: Path
) -> None:
    disks = tmp_path / "disks"
    await runtime.start(_spec(image, "img-gone", disk_mb=32))
    assert mount_lines(runtime.statedir.root, disks) and loops_backed_by(disks, image.path)
    await runtime.stop("img-gone")
    assert outside_pool(mount_lines(runtime.statedir.root, disks), disks) == []
    assert outside_pool(loops_backed_by(disks, image.path), disks) == []
    assert not disk_path(disks, "img-gone").exists()
    assert not runtime._root_paths("img-gone").entry.exists()


async def test_a_killed_sandbox_and_a_restarted_agent_leave_no_mounts(
    make_process_runtime: RuntimeFactory, tmp_path: Path, resolver: DictResolver, image: Image
) -> None:
    first = image_runtime(make_process_runtime, tmp_path, resolver)
    await first.start(_spec(image, "img-adopted", disk_mb=32))
    await first.start(_spec(image, "img-killed", disk_mb=32))
    # A new runtime object over the same root (an agent restarted) adopts both and holds their image.
    second_resolver = DictResolver(resolver.images)
    second = image_runtime(make_process_runtime, tmp_path, second_resolver)
    assert {h.id for h in await second.list()} == {"img-adopted", "img-killed"}
    assert second_resolver.held[image.digest] == 2
    # One dies under it: the next list tears its root down.
    record = second.statedir.load("img-killed")
    assert record is not None and hasattr(record, "init")
    os.kill(record.init.pid, signal.SIGKILL)
    for _ in range(100):
        if {h.id for h in await second.list()} == {"img-adopted"}:
            break
        await asyncio.sleep(0.02)
    assert {h.id for h in await second.list()} == {"img-adopted"}
    assert not disk_path(tmp_path / "disks", "img-killed").exists()
    alive = await second.exec("img-adopted", ["sudo", "id", "-u"])
    assert alive.stdout.strip() == "0"
    await second.stop("img-adopted")
    disks = tmp_path / "disks"
    assert outside_pool(mount_lines(second.statedir.root, disks), disks) == []
    assert outside_pool(loops_backed_by(disks, image.path), disks) == []
    assert second_resolver.held[image.digest] == 0


async def test_a_drained_pool_makes_a_disk_and_refills(
    runtime: ProcessRuntime, image: Image, tmp_path: Path
) -> None:
    pool = tmp_path / "disks" / ".pool"
    assert not pool.exists()
    await runtime.start(_spec(image, "img-pool-1", disk_mb=24))  # the pool was empty: made on demand
    for _ in range(200):
        if len(list(pool.glob("ready-24m-*"))) == 2:
            break
        await asyncio.sleep(0.02)
    assert len(list(pool.glob("ready-24m-*"))) == 2
    await runtime.start(_spec(image, "img-pool-2", disk_mb=24))
    assert len(list(pool.glob("ready-24m-*"))) <= 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"image": "sha256:nothex"}, "image"),
        ({"image": "../../etc"}, "image"),
        ({"disk_mb": 1}, "disk_mb"),
        ({"disk_mb": 1 << 40}, "disk_mb"),
        ({"user": "daemon"}, "user"),
        ({"workdir": "relative"}, "workdir"),
    ],
)
async def test_a_bad_image_spec_is_refused_before_anything_is_made(
    runtime: ProcessRuntime, image: Image, tmp_path: Path, change: dict[str, object], field: str
) -> None:
    spec = _spec(image, "img-bad", **change)
    with pytest.raises(InvalidSandbox) as refused:
        await runtime.start(spec)
    assert refused.value.field == field
    assert not any(runtime.statedir.ids()) and not (tmp_path / "disks").exists()


async def test_disk_user_and_workdir_need_an_image(runtime: ProcessRuntime) -> None:
    with pytest.raises(InvalidSandbox) as refused:
        await runtime.start(SandboxSpec(id="no-image", memory_mb=64, disk_mb=64))
    assert refused.value.field == "image"


async def test_root_user_and_workdir(runtime: ProcessRuntime, image: Image) -> None:
    await runtime.start(_spec(image, "img-root", user="root", workdir="/tmp"))
    who = await runtime.exec("img-root", ["sh", "-c", "id -u; pwd; echo $HOME"])
    assert who.stdout.split() == ["0", "/tmp", "/root"], who


async def test_disks_without_a_record_are_reclaimed_when_an_agent_starts(
    make_process_runtime: RuntimeFactory, tmp_path: Path, resolver: DictResolver, image: Image
) -> None:
    first = image_runtime(make_process_runtime, tmp_path, resolver)
    await first.start(_spec(image, "img-kept", disk_mb=24))
    await first.fill_disks(24)
    disks = tmp_path / "disks"
    # An agent killed, its records removed (a host restarted loses those under /run): its sandboxes'
    # disks are left, mounted, and so are the disks its pool held ready.
    pool = first._disks()
    orphan, odd = disk_path(disks, "img-lost"), disk_path(disks, "not..an-id")
    pool.take(24, orphan)
    pool.take(24, odd)
    await first.fill_disks(24)
    dead = sorted((disks / ".pool").glob("ready-24m-*"))[0]
    os.rename(dead, dead.with_name("ready-24m-999999999-1-0"))  # a maker that is gone
    ready = sorted((disks / ".pool").glob("ready-24m-*"))[:-1]
    assert ready and len(mount_lines(orphan, odd)) == 2
    second = image_runtime(make_process_runtime, tmp_path, resolver)
    assert [h.id for h in await second.list()] == ["img-kept"]
    assert not orphan.exists() and not odd.exists()
    assert disk_path(disks, "img-kept").exists()  # a live sandbox's disk stays
    assert sorted((disks / ".pool").glob("ready-24m-*")) == ready  # never used, its maker alive: kept
    kept_paths = second._root_paths("img-kept")
    left = [line for line in mount_lines(disks) if str(kept_paths.disk_mnt) not in line]
    assert outside_pool(left, disks) == [] and len(left) == len(ready)
    assert len(outside_pool(loops_backed_by(disks), disks)) == 1  # img-kept's
    kept = await second.exec("img-kept", ["sh", "-c", "echo ok > ~/f && cat ~/f"])
    assert kept.stdout == "ok\n"
    await second.stop("img-kept")
