"""An image sandbox's root: the overlay of its image (read-only, shared) and its own writable layer on
a disk of its own, made and unmade by host root around bubblewrap.

* The image's erofs file is loop-mounted once per runtime root and digest, read-only, ``nodev`` and
  ``nosuid``, under ``<root>/.images/<hex>``, and unmounted when no sandbox record names it.
* A sandbox's disk is a sparse ext4 file of its ``disk_mb`` (no journal, no reserved blocks): writes
  past it fail with ENOSPC, and the host's disk never holds more of it than that. Disks are made ahead
  in a small pool per size (:class:`DiskPool`), attached to a loop device and mounted there and then,
  so a create only renames one into place; a drained pool makes one on demand. A disk serves one
  sandbox and goes with it (never back to the pool); one whose sandbox has no record any more (a host
  restarted) is reclaimed when the runtime first lists its sandboxes, and so are the pool's disks
  whose maker is gone.
* The launcher's ``rootfs`` mode makes the sandbox's layer directories on its mounted disk, its user
  namespace (its uid range), clones the image's mount through that mapping (so the image's root is the
  sandbox's root, host uid ``base``) and mounts the overlay at ``<entry>/root``, which bubblewrap takes
  as ``/``.

Every mount of a sandbox sits at a path derived from its id (:class:`RootPaths`: its state directory,
its entry, its disk's directory), so a teardown after a crash finds them without any record.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import itertools
import os
import stat
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.runtime import launcher

DEFAULT_DISK_MB = 1024
MIN_DISK_MB = 16
MAX_DISK_MB = 1 << 20
DEFAULT_POOL_DEPTH = 2
_MIB = 1024 * 1024
_IMAGES = ".images"
_LOCK = ".lock"
_MNT_DETACH = 2
_READY = "ready-"
_MAKING = ".making-"
_DOOMED = ".doomed-"
# A disk is a directory (so one rename hands over the file and its mount together): the file, and
# the mount point its file system is mounted on.
_DISK = ".disk"
_FILE = "disk.img"
_MNT = "mnt"
_MKFS = (
    *("mkfs.ext4", "-q", "-F", "-m", "0"),
    *("-O", "^has_journal,^resize_inode,sparse_super2", "-E", "nodiscard,num_backup_sb=0"),
)


class RootfsError(Exception):
    """A sandbox's root could not be made (or an image it names is malformed)."""


# Where the overlays bubblewrap takes as ``/`` are mounted: bubblewrap runs as the sandbox's host uid
# and resolves the path of the root it binds, so every directory above it must be enterable by that
# uid. The directory is not listable; each entry in it is enterable by its sandbox's gid alone.
ROOTS_DIR = Path("/run/corral-roots")


@dataclass(frozen=True, slots=True)
class RootPaths:
    """Where one sandbox's root lives: the mounts only host root touches under its state directory
    ``dir`` (private), its disk (``disk_dir``: the file, mounted), and the overlay under ``entry``
    (see ROOTS_DIR)."""

    dir: Path
    entry: Path
    disk_dir: Path

    @property
    def disk(self) -> Path:
        return self.disk_dir / _FILE

    @property
    def disk_mnt(self) -> Path:
        return self.disk_dir / _MNT

    @property
    def userns(self) -> Path:
        return self.dir / "userns"

    @property
    def lower(self) -> Path:
        return self.dir / "lower"

    @property
    def merged(self) -> Path:
        return self.entry / "root"

    def mounts(self) -> tuple[Path, ...]:
        """Outermost first: the order they are unmounted in."""
        return (self.merged, self.lower, self.userns, self.disk_mnt)


_libc = ctypes.CDLL(None, use_errno=True)


def _umount(path: Path) -> None:
    """Unmount ``path`` if something is mounted there; a busy mount is detached instead."""
    for flags in (0, _MNT_DETACH):
        if _libc.umount2(os.fsencode(path), flags) == 0:
            return
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT, errno.ENOTDIR):  # not a mount point (any more), or gone
            return
        if err != errno.EBUSY:
            raise OSError(err, f"umount {path}: {os.strerror(err)}")
    raise OSError(errno.EBUSY, f"umount {path}: busy")


def mounted(path: Path) -> bool:
    target = os.fsencode(path)
    with open("/proc/self/mountinfo", "rb") as info:
        return any(line.split(b" ")[4] == target for line in info)


def disk_owners(disk_root: Path) -> list[str]:
    """The sandbox ids whose disks (``<id>.disk``) lie in ``disk_root``."""
    if not disk_root.is_dir():
        return []
    return sorted(p.name.removesuffix(_DISK) for p in disk_root.glob(f"*{_DISK}") if p.is_dir())


def disk_path(disk_root: Path, sandbox_id: str) -> Path:
    """The directory of a sandbox's disk (see :class:`RootPaths`)."""
    return disk_root / f"{sandbox_id}{_DISK}"


def remove_disk(disk_dir: Path) -> None:
    """Unmount a disk (which frees its loop device) and delete it (safe to repeat)."""
    if disk_dir.is_file():  # a pool's disk as made before disks were mounted ahead: a file alone
        disk_dir.unlink()
        return
    _umount(disk_dir / _MNT)
    (disk_dir / _FILE).unlink(missing_ok=True)
    for directory in (disk_dir / _MNT, disk_dir):
        with contextlib.suppress(FileNotFoundError):
            directory.rmdir()


def unmake(paths: RootPaths) -> None:
    """Unmount everything of a sandbox's root and delete its disk (safe to repeat; what is not
    mounted is skipped). The entry goes only once nothing is mounted in it."""
    for path in paths.mounts():
        _umount(path)
    remove_disk(paths.disk_dir)
    with contextlib.suppress(FileNotFoundError):
        paths.merged.rmdir()
    with contextlib.suppress(FileNotFoundError):
        paths.entry.rmdir()


def make_entry(paths: RootPaths, gid: int) -> None:
    """The sandbox's entry under ROOTS_DIR: host root's, enterable by the sandbox's gid alone."""
    paths.entry.parent.mkdir(mode=0o711, exist_ok=True)
    os.chmod(paths.entry.parent, 0o711)
    paths.entry.mkdir(mode=0o750)
    os.chown(paths.entry, 0, gid)
    os.chmod(paths.entry, 0o750)


def make(paths: RootPaths, *, image_mnt: Path, base: int, span: int) -> None:
    """Mount the sandbox's overlay root on its mounted disk (see the module docstring); undone by
    :func:`unmake`."""
    for directory in (paths.lower, paths.merged):
        directory.mkdir(mode=0o700, exist_ok=True)
    argv = [str(launcher.path()), "rootfs", str(base), str(base), str(span), str(image_mnt)]
    argv += [str(paths.disk_mnt), str(paths.userns), str(paths.lower), str(paths.merged)]
    _check_overlay_paths(argv[5:])
    _run(argv)


def _check_overlay_paths(paths: Sequence[str]) -> None:
    for path in paths:
        # The overlay's options are a comma-separated list: a path must not add an option.
        if any(c in path for c in ",:\\\n"):
            raise RootfsError(f"path {path!r} cannot be used in an overlay's options")


def make_unmapped(paths: RootPaths, *, image_mnt: Path) -> None:
    """The overlay of the image and the disk's ``upper`` at ``paths.merged``, as host root made them,
    no uid mapping: for a runtime whose guest kernel keeps its own uids (gVisor: its gofer writes the
    guest's uids as they are, on a disk only that sandbox mounts). ``nosuid``: no host process ever
    runs a file of it, and gVisor's kernel reads a file's setuid bit itself. Undone by :func:`unmake`."""
    upper, work = paths.disk_mnt / "upper", paths.disk_mnt / "work"
    for directory, mode in ((upper, 0o755), (work, 0o700), (paths.merged, 0o700)):
        directory.mkdir(mode=mode, exist_ok=True)
    _check_overlay_paths([str(image_mnt), str(upper), str(work)])
    options = f"lowerdir={image_mnt},upperdir={upper},workdir={work},nodev,nosuid,noatime"
    done = subprocess.run(
        ["mount", "-t", "overlay", "-o", options, "overlay", str(paths.merged)],
        capture_output=True,
        env=launcher.clean_env(),
        check=False,
    )
    if done.returncode != 0:
        raise RootfsError(f"cannot mount the overlay: {done.stderr.decode(errors='replace').strip()}")


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, env=launcher.clean_env(), check=False)
    if done.returncode != 0:
        raise RootfsError(done.stderr.decode(errors="replace").strip() or f"exit {done.returncode}")


def unpin_userns(paths: RootPaths) -> None:
    _umount(paths.userns)


def allow_suid(init_pid: int, pid_ns: int) -> None:
    _run([str(launcher.path()), "allow-suid", str(init_pid), str(pid_ns)])


def used_bytes(paths: RootPaths) -> int:
    """What the sandbox's writable layer holds on its disk."""
    fs = os.statvfs(paths.disk_mnt)
    return (fs.f_blocks - fs.f_bfree) * fs.f_frsize


# -- the places bubblewrap mounts onto, made safe before it runs ------------------------------------


def prepare_mountpoints(merged: Path, dirs: Sequence[str], files: Sequence[str], owner: int) -> None:
    """Make each of ``dirs`` a directory and ``files`` a regular file under the image root ``merged``
    (created, owned by ``owner``, when missing), walking with descriptors and never following a link:
    bubblewrap follows the image's links when it mounts, and an image's ``/etc`` -> ``/oldroot/tmp``
    would otherwise have it create files on the host. A link where a mount point belongs is removed
    (from the sandbox's own layer); anything else of the wrong kind refuses the image."""
    root = os.open(merged, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        for path in dirs:
            with _parent(root, path, owner) as (parent, name):
                _ensure(parent, name, stat.S_IFDIR, owner, path)
        for path in files:
            with _parent(root, path, owner) as (parent, name):
                _ensure(parent, name, stat.S_IFREG, owner, path)
    finally:
        os.close(root)


@contextlib.contextmanager
def _parent(root: int, path: str, owner: int) -> Iterator[tuple[int, str]]:
    *parents, name = path.strip("/").split("/")
    fd = os.dup(root)
    try:
        for part in parents:
            _ensure(fd, part, stat.S_IFDIR, owner, path)
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd, name
    finally:
        os.close(fd)


def _ensure(parent: int, name: str, kind: int, owner: int, path: str) -> None:
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISLNK(info.st_mode):
        os.unlink(name, dir_fd=parent)
        info = None
    if info is None:
        if kind == stat.S_IFDIR:
            os.mkdir(name, 0o755, dir_fd=parent)
        else:
            os.close(
                os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=parent)
            )
        os.chown(name, owner, owner, dir_fd=parent, follow_symlinks=False)
    elif stat.S_IFMT(info.st_mode) != kind:
        what = "a directory" if kind == stat.S_IFDIR else "a regular file"
        raise RootfsError(f"the image's /{path.strip('/')} must be {what}")


# -- images, mounted once per runtime root and digest ----------------------------------------------


class ImageMounts:
    """The read-only mounts of the images this runtime root's sandboxes use."""

    def __init__(self, root: Path) -> None:
        self.dir = root / _IMAGES
        self.dir.mkdir(mode=0o700, exist_ok=True)
        self._lock = threading.Lock()

    def path(self, digest: str) -> Path:
        return self.dir / digest.removeprefix("sha256:")

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with self._lock:
            fd = os.open(self.dir / _LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def mount(self, digest: str, image_file: Path) -> Path:
        target = self.path(digest)
        with self._locked():
            if not mounted(target):
                target.mkdir(mode=0o755, exist_ok=True)
                done = subprocess.run(
                    ["mount", "-t", "erofs", "-o", "ro,nodev,nosuid,loop", str(image_file), str(target)],
                    capture_output=True,
                    env=launcher.clean_env(),
                    check=False,
                )
                if done.returncode != 0:
                    raise RootfsError(
                        f"cannot mount image {digest}: {done.stderr.decode(errors='replace').strip()}"
                    )
        return target

    def unmount_unless(self, digest: str, in_use: Callable[[], bool]) -> None:
        """Unmount ``digest``'s image unless ``in_use()``, asked under the lock a mount takes: a start
        records its image before it mounts, so it is either seen here or mounts after."""
        target = self.path(digest)
        with self._locked():
            if not in_use():
                _umount(target)
                with contextlib.suppress(OSError):
                    target.rmdir()

    def mounted_digests(self) -> list[str]:
        return [f"sha256:{p.name}" for p in self.dir.iterdir() if p.is_dir() and mounted(p)]


# -- disks, made ahead ------------------------------------------------------------------------------


class DiskPool:
    """Disks made ahead, ``depth`` per size asked for lately, in ``directory``: each a sparse ext4 file
    already attached and mounted (the loop device and the mount are most of a disk's cost at a
    create). A take renames a ready one into place, file and mount together (atomic, so runtimes
    sharing the directory never take the same one); an empty pool makes one there and then.

    Each disk's name carries the pid of the process that made it: opening the pool removes those of
    makers that are gone (a crash, an agent restarted, a host rebooted), half made or ready, mounted
    or not, so none leaks a mount or a loop device."""

    def __init__(self, directory: Path, depth: int = DEFAULT_POOL_DEPTH) -> None:
        self.dir = directory
        self.depth = depth
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
        self._sizes: set[int] = set()
        self._counter = itertools.count()
        self._filling = threading.Lock()
        self.reclaim()

    def reclaim(self) -> int:
        """Remove the disks whose maker is gone; how many."""
        gone = 0
        for entry in self.dir.iterdir():
            name = entry.name
            if name.startswith(_READY):
                pid = name.split("-")[2]  # ready-<size>m-<pid>-...
            elif name.startswith((_MAKING, _DOOMED)):
                pid = name.split("-")[1]
            else:
                continue
            if not (pid.isdigit() and Path(f"/proc/{pid}").exists()):
                gone += self._discard(entry)
        return gone

    def _discard(self, entry: Path) -> bool:
        """Unmount and remove a disk of the pool, unless a take renamed it first (a take that comes
        after the rename never sees it)."""
        doomed = self.dir / f"{_DOOMED}{os.getpid()}-{threading.get_ident()}-{next(self._counter)}"
        try:
            os.rename(entry, doomed)
        except FileNotFoundError:
            return False
        remove_disk(doomed)
        return True

    def drain(self) -> int:
        """Stop keeping disks ready and remove those ready (after a fill in flight); how many."""
        with self._filling:
            self._sizes.clear()
            return sum(self._discard(ready) for ready in self.dir.glob(f"{_READY}*"))

    def ready(self, size_mb: int) -> list[Path]:
        return sorted(self.dir.glob(f"{_READY}{size_mb}m-*"))

    def note(self, size_mb: int) -> None:
        """Keep disks of ``size_mb`` ready from now on."""
        self._sizes.add(size_mb)

    def take(self, size_mb: int, target: Path) -> bool:
        """A mounted disk of ``size_mb`` at ``target`` (see :class:`RootPaths`); True when it came
        from the pool."""
        self.note(size_mb)
        for ready in self.ready(size_mb):
            try:
                os.rename(ready, target)
            except FileNotFoundError:
                continue  # another runtime took it
            # Mounted, unless the host restarted since (a reclaim then had not run yet): mount it now.
            if os.stat(target / _MNT).st_dev == os.stat(target).st_dev:
                _mount_disk(target)
            return True
        made = self._make(size_mb)
        os.rename(made, target)
        return False

    def fill(self) -> int:
        """Top every size asked for up to ``depth`` ready disks; how many were made."""
        if not self._filling.acquire(blocking=False):
            return 0
        try:
            made = 0
            for size_mb in sorted(self._sizes):
                for _ in range(self.depth - len(self.ready(size_mb))):
                    disk = self._make(size_mb)
                    os.rename(disk, self.dir / f"{_READY}{size_mb}m-{disk.name.removeprefix(_MAKING)}")
                    made += 1
            return made
        finally:
            self._filling.release()

    def _make(self, size_mb: int) -> Path:
        entry = self.dir / f"{_MAKING}{os.getpid()}-{threading.get_ident()}-{next(self._counter)}"
        try:
            entry.mkdir(mode=0o700)
            with open(entry / _FILE, "wb") as disk:
                disk.truncate(size_mb * _MIB)
            # No journal and no backup superblocks (the disk dies with its sandbox, never fsck'd), no
            # blocks reserved for online growth (it never grows): a fresh 1 GiB disk then takes 112 KiB
            # of the host's, not 656 KiB, which is most of what hundreds of idle sandboxes of one image
            # cost beside the image itself.
            done = subprocess.run(
                [*_MKFS, str(entry / _FILE)],
                capture_output=True,
                env=launcher.clean_env(),
                check=False,
            )
            if done.returncode != 0:
                raise RootfsError(f"mkfs.ext4 failed: {done.stderr.decode(errors='replace').strip()}")
            (entry / _MNT).mkdir(mode=0o700)
            _mount_disk(entry)
        except BaseException:
            remove_disk(entry)
            raise
        return entry


def _mount_disk(disk_dir: Path) -> None:
    """Attach a disk's file to a loop device (freed with the mount) and mount it nodev, nosuid."""
    _run([str(launcher.path()), "disk", str(disk_dir / _FILE), str(disk_dir / _MNT)])
