"""A crafted image changes nothing outside its own sandbox: a setuid-root binary is root inside only
(the range's first host uid), device nodes do not open, links pointing out resolve inside (and the
ones where bubblewrap mounts are replaced before it runs), and root inside cannot mount, make
devices, nest user namespaces or write the kernel's settings."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path

import pytest

from corral.runtime.base import SandboxSpec
from corral.runtime.process import ProcessRuntime
from corral.testing.erofs import crafted_image
from corral.testing.resolver import DictResolver
from tests.runtime.conftest import RuntimeFactory, cgroup_root, make_process_runtime
from tests.runtime.images import Image, base_uid, image_runtime, loops_backed_by, mount_lines, outside_pool

__all__ = ["cgroup_root", "make_process_runtime"]
pytestmark = [
    pytest.mark.process,
    pytest.mark.usefixtures("runtime_name"),
    pytest.mark.process_only(
        "it reads the process runtime's uid range and bubblewrap's mounts; gVisor's image sandboxes meet "
        "a hostile root in tests/runtime/test_gvisor_images.py"
    ),
]

_MARK = f"corral-crafted-{uuid.uuid4().hex[:8]}"
_HOST_TMP = Path("/tmp") / _MARK


def _lay_out(root: Path) -> None:
    # A setuid-root copy of id, and a setuid-root shell for anyone.
    shutil.copy2(root / "usr/bin/id", root / "usr/local/bin/rootid")
    os.chown(root / "usr/local/bin/rootid", 0, 0)
    os.chmod(root / "usr/local/bin/rootid", 0o4755)
    shutil.copy2(root / "usr/bin/dash", root / "usr/local/bin/rootsh")
    os.chown(root / "usr/local/bin/rootsh", 0, 0)
    os.chmod(root / "usr/local/bin/rootsh", 0o4755)
    # Device nodes: the host's memory, and the block device of the host's root file system.
    os.mknod(root / "mem", 0o666 | 0o020000, os.makedev(1, 1))
    host_root = os.stat("/").st_dev
    os.mknod(root / "hostdisk", 0o666 | 0o060000, os.makedev(os.major(host_root), os.minor(host_root)))
    # Links out: absolute, relative past the root, and where bubblewrap mounts (/etc/hosts, /dev
    # through /oldroot, bubblewrap's name for the host's root while it builds the sandbox).
    os.symlink("/etc/shadow", root / "shadow-link")
    os.symlink("../../../../../../../../", root / "up")
    (root / "etc/hosts").unlink(missing_ok=True)
    os.symlink(f"/oldroot{_HOST_TMP}/hosts", root / "etc/hosts")
    shutil.rmtree(root / "dev")
    os.symlink(f"/oldroot{_HOST_TMP}", root / "dev")


@pytest.fixture(scope="module")
def crafted() -> Image:
    digest, path = crafted_image(_lay_out)
    return Image(digest, path)


@pytest.fixture
def runtime(make_process_runtime: RuntimeFactory, tmp_path: Path, crafted: Image) -> ProcessRuntime:
    _HOST_TMP.mkdir(mode=0o777, exist_ok=True)
    os.chmod(_HOST_TMP, 0o777)  # world-writable: the sandbox's host uids could write here if it reached it
    return image_runtime(make_process_runtime, tmp_path, DictResolver({crafted.digest: crafted.path}))


async def _run(runtime: ProcessRuntime, command: str) -> tuple[int, str]:
    done = await runtime.exec("crafted", ["sh", "-c", command])
    return done.exit_code, done.stdout + done.stderr


async def test_a_crafted_image_changes_nothing_outside(
    runtime: ProcessRuntime, crafted: Image, tmp_path: Path
) -> None:
    host_shadow = Path("/etc/shadow").read_bytes()
    try:
        await runtime.start(SandboxSpec(id="crafted", memory_mb=256, image=crafted.digest, disk_mb=64))
        base = base_uid(runtime, "crafted")
        # bubblewrap mounted where it should, not through the links: nothing appeared on the host.
        assert list(_HOST_TMP.iterdir()) == []
        code, out = await _run(runtime, "cat /etc/hosts; ls -ld /dev; ls /dev")
        assert code == 0 and "localhost" in out and "null" in out, out

        # The setuid binaries give uid 0 inside, which is the range's first uid on the host.
        code, out = await _run(runtime, "rootid -u; rootsh -p -c 'touch /rooted; id -u'")
        assert out.split() == ["0", "0"], out
        rooted = runtime._root_paths("crafted").disk_mnt / "upper" / "rooted"
        assert rooted.stat().st_uid == base != 0

        # Device nodes of the image open nothing (the root is nodev), even for root inside.
        for node in ("/mem", "/hostdisk"):
            code, out = await _run(runtime, f"sudo head -c 16 {node} | od | head -1; echo rc=$?")
            assert "Permission denied" in out or "Operation not permitted" in out, (node, out)

        # Links resolve inside: the image's shadow, the sandbox's own root.
        code, out = await _run(runtime, "sudo cat /shadow-link")
        assert code == 0 and out.encode() != host_shadow and "user:" in out, out
        code, out = await _run(runtime, "ls /up/; ls /up/up/usr/local/bin")
        assert "rootid" in out and "home" in out, out

        # Root inside administers nothing of the kernel's, nor makes devices, mounts or namespaces.
        attacks = {
            "mknod /tmp/mem c 1 1": "Operation not permitted",
            "mount -t tmpfs none /mnt": "ermission denied",
            "unshare -U true": "",
            "unshare -m true": "",
            "echo 1 > /proc/sys/vm/drop_caches": "",
            "echo x > /proc/sys/kernel/hostname": "",
            "chroot / true": "",
        }
        for attack, expected in attacks.items():
            code, out = await _run(runtime, f"sudo sh -c '{attack}'")
            assert code != 0 and expected in out, (attack, code, out)
        code, out = await _run(runtime, "sudo cat /proc/self/status | grep CapBnd")
        # A container's root set, no CAP_SYS_ADMIN (bit 21), CAP_SYS_PTRACE (19) or CAP_MKNOD (27).
        bounding = int(out.split()[1], 16)
        assert not bounding & (1 << 21 | 1 << 19 | 1 << 27), out
        assert list(_HOST_TMP.iterdir()) == []
    finally:
        if "crafted" in {h.id for h in await runtime.list()}:
            await runtime.stop("crafted")
        shutil.rmtree(_HOST_TMP, ignore_errors=True)
    assert Path("/etc/shadow").read_bytes() == host_shadow
    disks = tmp_path / "disks"
    assert outside_pool(mount_lines(runtime.statedir.root, disks), disks) == []
    assert outside_pool(loops_backed_by(disks, crafted.path), disks) == []
