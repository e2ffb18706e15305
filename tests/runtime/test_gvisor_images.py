"""Image sandboxes on gVisor: the image's overlay over a disk of their own as the container's root, the
image's users running its commands inside gVisor's kernel, torn down to the last mount and loop
device; and a tenant root inside who attacks the host's files through that root."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import stat
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from corral.runtime.base import InvalidSandbox, SandboxSpec
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.gvisor import GvisorRuntime, unavailable_reason
from corral.runtime.rootfs import disk_path
from corral.testing.erofs import crafted_image
from corral.testing.resolver import DictResolver
from tests.runtime.images import Image, loops_backed_by, mount_lines, outside_pool

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"gvisor: {unavailable_reason()}"),
]
_MIB = 1024 * 1024

Make = Callable[[DictResolver], GvisorRuntime]


_ONLY_HERE = "/etc/corral-gvisor-image-test"


def _marked(root: Path) -> None:
    (root / _ONLY_HERE.lstrip("/")).write_text("from the image\n")


@pytest.fixture(scope="session")
def image() -> Image:
    """The small base with a file of its own: an image file of this module's alone (a check that no
    loop device of an image is left looks at every one of that file, machine-wide, and the process
    runtime's tests run beside these on the small base)."""
    digest, path = crafted_image(_marked)
    return Image(digest, path)


@pytest.fixture
def resolver(image: Image) -> DictResolver:
    return DictResolver({image.digest: image.path})


@pytest.fixture
async def make(tmp_path: Path, cgroup_root: CgroupRoot) -> AsyncIterator[Make]:
    """Runtimes over one root and disk root (a second one is an agent restarted); at the end every
    sandbox is stopped and nothing of their roots is left: no mount, loop device, disk or directory."""
    made: list[GvisorRuntime] = []

    def build(resolver: DictResolver) -> GvisorRuntime:
        runtime = GvisorRuntime(
            tmp_path / "gvisor",
            cgroup_root=cgroup_root,
            cgroup_prefix="img-",
            images=resolver,
            disk_root=tmp_path / "disks",
        )
        made.append(runtime)
        return runtime

    yield build
    for runtime in made:
        for sandbox in (tmp_path / "gvisor" / "sandboxes").glob("*"):
            await runtime.stop(sandbox.name)
        await runtime.drain_disks()
    assert not list((tmp_path / "gvisor" / "sandboxes").glob("*"))
    assert_nothing_left(tmp_path)


def assert_nothing_left(tmp_path: Path, *images: Path) -> None:
    disks = tmp_path / "disks"
    assert outside_pool(mount_lines(tmp_path / "gvisor", disks), disks) == []
    assert outside_pool(loops_backed_by(disks, *images), disks) == []
    assert rootfs_disks(disks) == []


def rootfs_disks(disks: Path) -> list[str]:
    return sorted(p.name for p in disks.glob("*.disk")) if disks.exists() else []


@pytest.fixture
def runtime(make: Make, resolver: DictResolver) -> GvisorRuntime:
    return make(resolver)


def _spec(base: Image, sandbox_id: str, **kwargs: object) -> SandboxSpec:
    kwargs.setdefault("image", base.digest)
    return SandboxSpec(id=sandbox_id, memory_mb=256, **kwargs)  # type: ignore[arg-type]


async def _sh(runtime: GvisorRuntime, sandbox_id: str, script: str, **kwargs: object) -> tuple[int, str]:
    if "user" in kwargs:
        spawned = await runtime.spawn(sandbox_id, ["sh", "-c", script], user=str(kwargs["user"]))
        out, err = await asyncio.gather(spawned.stdout.read(), spawned.stderr.read())
        return await spawned.wait(), (out + err).decode()
    done = await runtime.exec(sandbox_id, ["sh", "-c", script])
    return done.exit_code, done.stdout + done.stderr


async def test_the_image_s_programs_and_users_run_inside_gvisor_s_kernel(
    runtime: GvisorRuntime, image: Image, resolver: DictResolver
) -> None:
    await runtime.start(_spec(image, "gv-img", nameserver="192.0.2.53"))
    # The image's accounts and files, not the host's: the host's uid 1000 is another name, and the
    # host's runsc and this worktree are not there.
    code, out = await _sh(runtime, "gv-img", "id -un; id -u; pwd; echo $HOME; getent passwd 1000")
    lines = out.splitlines()
    assert code == 0 and lines[:4] == ["user", "1000", "/home/user", "/home/user"], out
    assert lines[4].startswith("user:x:1000:1000:"), out
    code, out = await _sh(runtime, "gv-img", f"test -e /usr/bin/runsc || test -e {Path.cwd()} || echo absent")
    assert out.strip() == "absent", out
    assert (await runtime.exec("gv-img", ["cat", _ONLY_HERE])).stdout == "from the image\n"
    # Listing works on the image's root too: its /etc/ld.so.preload names the statx shim.
    listed = await runtime.exec("gv-img", ["ls", "-l", _ONLY_HERE])
    assert listed.exit_code == 0 and listed.stderr == "", listed
    # The kernel is gVisor's.
    code, out = await _sh(runtime, "gv-img", "dmesg; cat /proc/version")
    assert code == 0 and "Starting gVisor" in out and Path("/proc/version").read_text() not in out, out
    # The image's root user, asked for by a command; the hosts and resolv.conf files are the
    # sandbox's own (its resolver: a slot's, as a process sandbox's).
    code, out = await _sh(runtime, "gv-img", "id -u; echo $HOME; pwd", user="root")
    assert (code, out.split()) == (0, ["0", "/root", "/root"]), out
    hosts = await runtime.exec("gv-img", ["cat", "/etc/hosts"])
    assert "gv-img" in hosts.stdout, hosts
    resolv = await runtime.exec("gv-img", ["cat", "/etc/resolv.conf"])
    assert resolv.stdout.startswith("nameserver 192.0.2.53\n"), resolv
    assert await runtime.guest_program("gv-img") is not None
    assert resolver.held[image.digest] == 1


async def test_the_spec_s_user_and_workdir_and_unknown_users_refused(
    runtime: GvisorRuntime, image: Image, tmp_path: Path
) -> None:
    await runtime.start(_spec(image, "gv-root", user="root", workdir="/tmp"))
    code, out = await _sh(runtime, "gv-root", "id -u; pwd; echo $HOME")
    assert (code, out.split()) == (0, ["0", "/tmp", "/root"]), out
    with pytest.raises(InvalidSandbox) as refused:
        await runtime.spawn("gv-root", ["true"], user="daemon")
    assert refused.value.field == "user"
    with pytest.raises(InvalidSandbox) as refused:
        await runtime.start(_spec(image, "gv-daemon", user="daemon"))
    assert refused.value.field == "user"
    with pytest.raises(InvalidSandbox) as refused:
        await runtime.start(SandboxSpec(id="gv-no-image", memory_mb=128, disk_mb=64))
    assert refused.value.field == "image"
    assert not (tmp_path / "gvisor" / "sandboxes" / "gv-daemon").exists()


@pytest.mark.xfail(
    strict=True,
    reason="runsc 20221219 ignores noNewPrivileges: false and never honours a setuid bit (its kernel "
    "acts as if no_new_privs were always set), so the image's sudo cannot raise a command to root",
)
async def test_sudo_of_the_image_is_root(runtime: GvisorRuntime, image: Image) -> None:
    await runtime.start(_spec(image, "gv-sudo"))
    sudo = await runtime.exec("gv-sudo", ["sudo", "id", "-u"])
    assert (sudo.exit_code, sudo.stdout.strip()) == (0, "0"), sudo


async def test_writes_land_on_the_layer_and_enospc_at_disk_mb(
    runtime: GvisorRuntime, image: Image, tmp_path: Path
) -> None:
    disk_mb = 32
    await runtime.start(_spec(image, "gv-full", disk_mb=disk_mb))
    paths = runtime._root_paths("gv-full")
    before = paths.disk.stat().st_blocks * 512
    code, out = await _sh(runtime, "gv-full", "echo mine > ~/note && cat ~/note")
    assert (code, out) == (0, "mine\n")
    # On its own disk's layer, as the guest's uid (gVisor's gofer writes it as it is).
    note = paths.disk_mnt / "upper" / "home" / "user" / "note"
    assert note.read_text() == "mine\n" and note.stat().st_uid == 1000
    assert not (image.path.parent / "note").exists()
    code, out = await _sh(
        runtime, "gv-full", "dd if=/dev/urandom of=/home/user/big bs=1M count=256 2>&1; sync"
    )
    assert "No space left on device" in out, out
    wrote = await runtime.exec("gv-full", ["wc", "-c", "/home/user/big"])
    assert disk_mb * _MIB * 0.8 < int(wrote.stdout.split()[0]) <= disk_mb * _MIB, wrote
    # The host's disk gave it at most its cap (the sparse file's blocks), having held next to nothing.
    assert before < 4 * _MIB
    assert paths.disk.stat().st_blocks * 512 <= disk_mb * _MIB
    used = await runtime.disk_used_mb("gv-full")
    assert used is not None and disk_mb * 0.8 < used <= disk_mb
    await runtime.stop("gv-full")
    assert not paths.disk.exists()


async def test_stop_and_an_agent_restart_leave_nothing_and_keep_what_runs(
    make: Make, resolver: DictResolver, image: Image, tmp_path: Path, cgroup_root: CgroupRoot
) -> None:
    first = make(resolver)
    await asyncio.gather(
        first.start(_spec(image, "gv-kept", disk_mb=24)), first.start(_spec(image, "gv-dies", disk_mb=24))
    )
    wrote = await first.exec("gv-kept", ["sh", "-c", "echo kept > ~/f"])
    assert wrote.exit_code == 0
    disks = tmp_path / "disks"
    assert rootfs_disks(disks) == ["gv-dies.disk", "gv-kept.disk"]
    # One read-only mount of the image for both.
    assert len([line for line in mount_lines(tmp_path / "gvisor") if " erofs " in line]) == 1
    # An agent restarted: a new runtime object over the same root adopts both and holds their image.
    again = DictResolver(resolver.images)
    second = make(again)
    assert {h.id for h in await second.list()} == {"gv-dies", "gv-kept"}
    assert again.held[image.digest] == 2
    # One's Sentry dies: listed no more, and that listing leaves nothing of its root.
    sentry = [
        p
        for p in second.host_pids("gv-dies")
        if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"runsc-sandbox")
    ]
    assert len(sentry) == 1
    os.kill(sentry[0], signal.SIGKILL)
    for _ in range(200):
        if {h.id for h in await second.list()} == {"gv-kept"}:
            break
        await asyncio.sleep(0.05)
    assert {h.id for h in await second.list()} == {"gv-kept"}
    assert rootfs_disks(disks) == ["gv-kept.disk"]
    assert again.held[image.digest] == 1
    kept = await second.exec("gv-kept", ["cat", "/home/user/f"])
    assert kept.stdout == "kept\n", kept
    await second.stop("gv-kept")
    assert again.held[image.digest] == 0
    assert_nothing_left(tmp_path, image.path)  # the image's mount too: no sandbox runs on it


async def test_a_disk_without_a_sandbox_is_reclaimed_at_adoption(
    make: Make, resolver: DictResolver, image: Image, tmp_path: Path
) -> None:
    first = make(resolver)
    await first.start(_spec(image, "gv-live", disk_mb=24))
    # A host restarted: the sandbox directories (under /run) are gone, its disks (on a disk) not.
    orphan = disk_path(tmp_path / "disks", "gv-lost")
    await asyncio.to_thread(first._roots.disks().take, 24, orphan)
    assert mount_lines(orphan)
    second = make(resolver)
    assert [h.id for h in await second.list()] == ["gv-live"]
    assert not orphan.exists() and mount_lines(orphan) == []
    assert rootfs_disks(tmp_path / "disks") == ["gv-live.disk"]


# -- a hostile tenant, root inside gVisor ----------------------------------------------------------


def _lay_out(root: Path) -> None:
    # A setuid-root shell, a node of the host's memory and of its root file system's block device,
    # links out of the root (absolute, and relative past it).
    shutil.copy2(root / "usr/bin/dash", root / "usr/local/bin/rootsh")
    os.chown(root / "usr/local/bin/rootsh", 0, 0)
    os.chmod(root / "usr/local/bin/rootsh", 0o4755)
    os.mknod(root / "mem", 0o666 | stat.S_IFCHR, os.makedev(1, 1))
    host_root = os.stat("/").st_dev
    os.mknod(root / "hostdisk", 0o666 | stat.S_IFBLK, os.makedev(os.major(host_root), os.minor(host_root)))
    os.symlink("/etc/shadow", root / "shadow-link")
    os.symlink("../../../../../../../../", root / "up")


@pytest.fixture(scope="module")
def crafted() -> Image:
    digest, path = crafted_image(_lay_out)
    return Image(digest, path)


async def test_root_inside_reaches_no_host_file_through_its_root(
    make: Make, crafted: Image, tmp_path: Path
) -> None:
    runtime = make(DictResolver({crafted.digest: crafted.path}))
    marker = tmp_path / "host-only"
    secret = f"host-only-{os.urandom(8).hex()}"
    marker.write_text(secret)
    host_shadow = Path("/etc/shadow").read_bytes()
    await runtime.start(_spec(crafted, "gv-hostile", disk_mb=64))

    async def as_root(script: str) -> tuple[int, str]:
        return await _sh(runtime, "gv-hostile", script, user="root")

    # Walks out of the root end at its own root: /proc's links, .. past /, the image's links.
    for walk in ("/proc/self/root", "/proc/1/root", "/../../..", "/up", "/up/up/.."):
        code, out = await as_root(f"cat {walk}{marker}; echo {walk}/*; echo {walk}/usr/local/bin/*")
        assert secret not in out, (walk, out)
        # Inside its own root, or refused (the init, pid 1, is not dumpable: its root is not shown).
        inside = "rootsh" in out and "/hostdisk" in out
        assert inside or (walk.startswith("/proc/1/") and "Permission denied" in out), (walk, out)
    code, out = await as_root("cat /shadow-link")
    assert code == 0 and out.encode() != host_shadow and "user:" in out, out
    # Device nodes of the image and new ones open nothing of the host's.
    for node in ("/mem", "/hostdisk"):
        code, out = await as_root(f"head -c 4096 {node} | od | head -2; echo rc=$?")
        refused = "Permission denied" in out or "Operation not permitted" in out
        assert refused and not host_disk_bytes(out), (node, out)
    code, out = await as_root("mknod /tmp/disk b 8 0 && head -c 512 /tmp/disk | od | head -1")
    assert not host_disk_bytes(out) and ("No such device" in out or "not permitted" in out), out
    # A setuid-root file root writes is on its own disk's layer only (root-owned there, nosuid on the
    # host), and the image's setuid shell is the image's.
    code, out = await as_root("cp /usr/local/bin/rootsh /made && chmod 4755 /made && echo made")
    assert code == 0 and "made" in out, out
    made = runtime._root_paths("gv-hostile").disk_mnt / "upper" / "made"
    assert made.stat().st_mode & stat.S_ISUID and made.stat().st_uid == 0
    assert "nosuid" in " ".join(mount_lines(runtime._root_paths("gv-hostile").merged))
    assert [p for p in (tmp_path / "gvisor").rglob("made") if p.is_file()] == [
        runtime._root_paths("gv-hostile").merged / "made"
    ]
    # A link root makes inside resolves inside when the runtime reads the layer (it never follows it).
    code, out = await as_root(f"ln -s {marker} /home/user/out && cat /home/user/out; echo rc=$?")
    assert secret not in out, out
    await runtime.stop("gv-hostile")
    assert marker.read_text() == secret and Path("/etc/shadow").read_bytes() == host_shadow
    assert_nothing_left(tmp_path, crafted.path)


def host_disk_bytes(out: str) -> bool:
    """Whether a dump read something (anything past an empty read): a node opening the host's memory
    or disk would give bytes; one refused or empty gives none."""
    return any(line[:7].isdigit() and len(line.split()) > 1 for line in out.splitlines())
