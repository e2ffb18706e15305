"""Image files for tests: the small Debian base (:func:`corral.testing.images.small_base`) unpacked,
given the fix-ups every image root has (a user ``user`` of uid 1000 with home /home/user, passwordless
sudo, the /proc /dev /sys /tmp mount points) and packed with ``mkfs.erofs``, once per machine and kept
under the test cache; and crafted images (a tree a test lays out itself) packed the same way."""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from corral.images.digest import digest_file
from corral.testing.images import cache_dir, small_base

USER = "user"
UID = 1000
HOME = f"/home/{USER}"
SUDOERS = f"{USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
MOUNT_POINTS = ("proc", "dev", "sys", "tmp")


def fix_up(root: Path) -> None:
    """What an image root needs that a Debian base lacks: the user, its home, sudo for it."""
    for name in MOUNT_POINTS:
        (root / name).mkdir(exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    files = {
        "passwd": f"{USER}:x:{UID}:{UID}:{USER}:{HOME}:/bin/bash\n",
        "group": f"{USER}:x:{UID}:\n",
        "shadow": f"{USER}:*:19000:0:99999:7:::\n",
    }
    for name, line in files.items():
        path = root / "etc" / name
        text = path.read_text() if path.exists() else ""
        if not any(entry.split(":")[0] == USER for entry in text.splitlines()):
            path.write_text(text + line)
    home = root / HOME.lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    os.chown(home, UID, UID)
    os.chmod(home, 0o755)
    sudoers = root / "etc" / "sudoers.d" / USER
    sudoers.parent.mkdir(exist_ok=True)
    sudoers.write_text(SUDOERS)
    os.chmod(sudoers, 0o440)


def pack(root: Path, target: Path) -> Path:
    """``root`` as an erofs image file at ``target`` (lz4, owners and modes kept)."""
    if shutil.which("mkfs.erofs") is None:
        raise RuntimeError("mkfs.erofs is missing: `make system-deps` installs erofs-utils")
    partial = target.with_name(target.name + ".partial")
    subprocess.run(
        ["mkfs.erofs", "--quiet", "-zlz4", str(partial), str(root)],
        check=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    partial.rename(target)
    return target


def _unpack_base(root: Path) -> None:
    subprocess.run(
        ["tar", "-xpf", str(small_base()), "-C", str(root), "--numeric-owner"],
        check=True,
        stdin=subprocess.DEVNULL,
    )


def small_image() -> Path:
    """The small base as an image file (fixed up), built once per machine."""
    target = cache_dir() / "base-bookworm-minbase-sudo-user.erofs"
    if not target.exists():
        _build_once(target)
    return target


def crafted_image(lay_out: Callable[[Path], None]) -> tuple[str, Path]:
    """The small base fixed up, then changed by ``lay_out(root)`` (a test's hostile contents), packed;
    returns its digest and path. Kept in the test cache under the hash of ``lay_out``'s source."""
    key = hashlib.sha256(inspect.getsource(lay_out).encode()).hexdigest()[:16]
    target = cache_dir() / f"crafted-{key}.erofs"
    _build_once(target, lay_out)
    return digest_file(target), target


def _build_once(target: Path, lay_out: Callable[[Path], None] | None = None) -> None:
    """Pack the small base, fixed up and changed by ``lay_out``, at ``target`` unless it is there:
    under a lock beside it, so processes asking for it at once build it once."""
    with (cache_dir() / f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            with tempfile.TemporaryDirectory(dir=cache_dir()) as work:
                root = Path(work) / "root"
                root.mkdir()
                _unpack_base(root)
                fix_up(root)
                if lay_out is not None:
                    lay_out(root)
                pack(root, target)
