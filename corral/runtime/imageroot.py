"""What every runtime that runs image sandboxes shares on a host (the process runtime and gVisor's):
the spec checks of an image sandbox, the users its commands run as, and :class:`ImageRoots`: where its
image's file comes from (the resolver, held while a sandbox runs on it), the image's read-only mount
(once per runtime root and digest) and the pool of writable disks, reclaimed at an agent's restart.
How a runtime lays its overlay over them is its own (see :mod:`corral.runtime.rootfs`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path

from corral.images.digest import check_digest
from corral.images.resolver import ImageResolver
from corral.runtime import bwrap, launcher, rootfs
from corral.runtime.base import InvalidSandbox, RuntimeFailure, SandboxSpec
from corral.runtime.statedir import valid_id

# Image sandboxes' disks: on a disk, never under /run (a tmpfs on most hosts); one directory per root.
DEFAULT_DISK_ROOT = Path("/var/lib/corral/disks")
# The users of an image sandbox, their uids inside (its image's /etc/passwd names them).
USERS = {bwrap.SANDBOX_USER: bwrap.SANDBOX_UID, bwrap.ROOT_USER: 0}
_POOL = ".pool"


def check_user(user: str | None) -> None:
    if user is not None and user not in USERS:
        raise InvalidSandbox(f"user must be one of {sorted(USERS)}, got {user!r}", "user")


def validate(spec: SandboxSpec) -> None:
    """An image sandbox's spec: its digest, disk size, user and workdir (nothing made yet)."""
    try:
        check_digest(spec.image or "")
    except ValueError as exc:
        raise InvalidSandbox(str(exc), "image") from None
    disk_mb = spec.disk_mb if spec.disk_mb is not None else rootfs.DEFAULT_DISK_MB
    if not rootfs.MIN_DISK_MB <= disk_mb <= rootfs.MAX_DISK_MB:
        raise InvalidSandbox(
            f"disk_mb must be between {rootfs.MIN_DISK_MB} and {rootfs.MAX_DISK_MB}, got {disk_mb}",
            "disk_mb",
        )
    check_user(spec.user)
    if spec.workdir is not None:
        try:
            launcher.check_command(["true"], {}, spec.workdir)
        except launcher.BadCommand:
            raise InvalidSandbox("workdir must be an absolute path without NUL bytes", "workdir") from None


def refuse_without_image(spec: SandboxSpec) -> None:
    if spec.image is None and (spec.disk_mb is not None or spec.user is not None or spec.workdir is not None):
        raise InvalidSandbox("disk_mb, user and workdir need an image", "image")


def command_user(spec: SandboxSpec, user: str | None) -> tuple[str, int, str]:
    """Who a command of the sandbox runs as (``user``, else its spec's, else the sandbox user): its
    name, its uid inside and the directory it starts in unless told (the spec's workdir, else its
    home). A sandbox on the host's root has its one user only."""
    if user is not None and spec.image is None and user != bwrap.SANDBOX_USER:
        raise InvalidSandbox(
            f"user {user!r} runs only in a sandbox of an image template (root inside, nobody on the "
            f"host); this one runs on the host's own system, as its one user {bwrap.SANDBOX_USER!r}",
            "user",
        )
    check_user(user)
    name = user or spec.user or bwrap.SANDBOX_USER
    if spec.image is None:
        return name, bwrap.SANDBOX_UID, bwrap.SANDBOX_HOME
    home = bwrap.ROOT_HOME if name == bwrap.ROOT_USER else bwrap.SANDBOX_HOME
    return name, USERS[name], spec.workdir or home


class ImageRoots:
    """One runtime root's images and disks: the resolver, the image mounts under ``mounts_root``, the
    disk pool under ``disk_root`` (opened on first use: opening reclaims what a gone maker left, so
    only ever from a worker thread) and which sandboxes hold their image in the resolver."""

    def __init__(
        self, images: ImageResolver | None, mounts_root: Path, disk_root: Path, pool_depth: int
    ) -> None:
        self.images = images
        self.disk_root = disk_root
        self._mounts_root = mounts_root
        self._pool_depth = pool_depth
        self._mounts: rootfs.ImageMounts | None = None
        self._pool: rootfs.DiskPool | None = None
        self._pool_opening = threading.Lock()
        self._filling: asyncio.Task[int] | None = None
        self._held: set[str] = set()

    def require(self, privileged: bool) -> None:
        if not privileged or self.images is None:
            raise RuntimeFailure("this runtime cannot run images (it needs root and an image resolver)")

    def disks(self) -> rootfs.DiskPool:
        with self._pool_opening:
            if self._pool is None:
                self._pool = rootfs.DiskPool(self.disk_root / _POOL, self._pool_depth)
            return self._pool

    def mounts(self) -> rootfs.ImageMounts:
        if self._mounts is None:
            self._mounts = rootfs.ImageMounts(self._mounts_root)
        return self._mounts

    async def take(self, spec: SandboxSpec, disk_dir: Path) -> Path:
        """The sandbox's image held and mounted (its mount's path returned), its disk of ``disk_mb``
        taken from the pool to ``disk_dir``, mounted; the pool refilled in the background."""
        assert spec.image is not None and self.images is not None
        image_file = await self.images.local_path(spec.image)
        self._held.add(spec.id)
        image_mnt = await asyncio.to_thread(self.mounts().mount, spec.image, image_file)
        size = spec.disk_mb if spec.disk_mb is not None else rootfs.DEFAULT_DISK_MB
        await asyncio.to_thread(lambda: self.disks().take(size, disk_dir))
        if self._filling is None or self._filling.done():
            self._filling = asyncio.ensure_future(asyncio.to_thread(lambda: self.disks().fill()))
        return image_mnt

    async def fill(self, disk_mb: int) -> int:
        def fill() -> int:
            pool = self.disks()
            pool.note(disk_mb)
            return pool.fill()

        return await asyncio.to_thread(fill)

    async def drain(self) -> None:
        if self._pool is not None:
            await asyncio.to_thread(self._pool.drain)

    async def hold(self, sandbox_id: str, digest: str | None) -> None:
        """A re-adopted sandbox's image, held from this resolver too (a cache must not evict what a
        sandbox runs on)."""
        if digest is None or sandbox_id in self._held or self.images is None:
            return
        with contextlib.suppress(Exception):  # it runs on its mounted image either way
            await self.images.local_path(digest)
            self._held.add(sandbox_id)

    def release(self, sandbox_id: str, digest: str | None) -> None:
        """The sandbox's hold on its image, let go (its root unmade already)."""
        if digest is not None and sandbox_id in self._held and self.images is not None:
            self._held.discard(sandbox_id)
            self.images.release(digest)

    def unmount_unless(self, digest: str, in_use: Callable[[], bool]) -> None:
        self.mounts().unmount_unless(digest, in_use)

    def reclaim(self, keep: Callable[[str], bool], unmake: Callable[[str], None]) -> int:
        """Remove the disks of sandboxes the runtime has no record of (``keep`` says which it has),
        once, at an agent's adoption: a host restarted loses the records (under /run) but not the
        disks. A start records its sandbox before it takes a disk, and a teardown removes the disk
        before the record, so a disk without a record is nobody's. The pool's ready disks stay while
        their maker lives; those of a maker that is gone are unmounted and removed. ``unmake`` undoes
        what the runtime mounted over a disk of a valid id."""
        gone = 0
        if (self.disk_root / _POOL).is_dir():
            gone += self.disks().reclaim()
        for sandbox_id in rootfs.disk_owners(self.disk_root):
            if valid_id(sandbox_id) and keep(sandbox_id):
                continue
            if valid_id(sandbox_id):
                unmake(sandbox_id)
            else:
                rootfs.remove_disk(rootfs.disk_path(self.disk_root, sandbox_id))
            gone += 1
        return gone
