"""A host's images on its own disk: the :class:`~corral.images.resolver.ImageResolver` its agent and
runtime ask, fed from the control plane's blob store.

- **Once per digest.** Concurrent asks for an image the host lacks wait on one fetch; a caller that
  gives up (a cancelled create) does not cancel it for the others.
- **Verified, never trusted.** The bytes are hashed as they are written beside the final name and
  renamed into place only when they hash to the digest; a corrupted or short transfer is thrown away
  and fetched again (``attempts`` in all), never used. A file found on disk at start (kept from before
  a restart) is hashed again before its first use.
- **A disk budget, LRU.** Once the images held pass ``budget_bytes``, the least recently used ones no
  sandbox uses are deleted. An image in use is never deleted: a budget smaller than what the host's
  sandboxes use is exceeded rather than a create refused.
- **Survives a restart.** The files are the cache: their names say their digests, their mtimes their
  order of last use; what the live sandboxes use is counted again by whoever holds them (``hold``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Protocol

from corral.images.blobs import BlobNotFound
from corral.images.digest import check_digest, digest_file

log = logging.getLogger("corral.images")

_PARTIAL = ".partial"
FETCH_ATTEMPTS = 3
# A host's image cache, by default: a few dozen images of a Debian base and some packages.
DEFAULT_IMAGE_CACHE_MB = 20 * 1024
RETRY_BASE_S = 0.2


class ImageSource(Protocol):
    """Where a host's missing images come from: a :class:`~corral.images.blobs.BlobStore` in the same
    process, or the control plane's image route over HTTP. BlobNotFound: no such image anywhere."""

    def read(self, digest: str) -> AsyncIterator[bytes]: ...


class ImageUnavailable(Exception):
    """The image could not be had on this host: absent from the source, or every transfer failed or
    did not hash to the digest."""

    def __init__(self, digest: str, reason: str) -> None:
        self.digest = digest
        self.reason = reason
        super().__init__(f"image {digest}: {reason}")


class ImageCorrupt(Exception):
    """A transfer whose bytes did not hash to the digest asked for."""


@dataclass(slots=True)
class _CachedImage:
    size: int
    used_at: int  # this cache's counter: larger is more recent
    users: int = 0
    verified: bool = True


class ImageCache:
    def __init__(
        self,
        root: Path,
        source: ImageSource,
        budget_bytes: int,
        *,
        attempts: int = FETCH_ATTEMPTS,
        retry_base_s: float = RETRY_BASE_S,
    ) -> None:
        if budget_bytes < 0 or attempts < 1:
            raise ValueError("budget_bytes must not be negative and attempts must be at least 1")
        self.root = root
        self.source = source
        self.budget_bytes = budget_bytes
        self.attempts = attempts
        self.retry_base_s = retry_base_s
        self._entries: dict[str, _CachedImage] = {}
        self._fetching: dict[str, asyncio.Task[None]] = {}
        self._clock = 0
        self.fetches = 0  # transfers begun (retries included): what "fetched once" counts
        self.refused = 0  # transfers thrown away: short, failed or not hashing to the digest
        self._load()

    # -- what is held ------------------------------------------------------------------------------

    def path(self, digest: str) -> Path:
        return self.root / check_digest(digest).replace(":", "-")

    def _load(self) -> None:
        found = []
        for p in self.root.iterdir() if self.root.is_dir() else ():
            if _PARTIAL in p.name:
                p.unlink(missing_ok=True)  # a transfer a crash cut short
                continue
            digest = p.name.replace("-", ":", 1)
            try:
                check_digest(digest)
                st = p.stat()
            except (ValueError, OSError):
                continue
            found.append((st.st_mtime_ns, digest, st.st_size))
        for _, digest, size in sorted(found):
            self._entries[digest] = _CachedImage(size, self._tick(), verified=False)

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    @property
    def used_bytes(self) -> int:
        return sum(e.size for e in self._entries.values())

    def held(self, limit: int | None = None) -> list[str]:
        """The digests on this host's disk, most recently used first (``limit``: at most that many)."""
        ranked = sorted(self._entries, key=lambda d: -self._entries[d].used_at)
        return ranked if limit is None else ranked[:limit]

    def has(self, digest: str) -> bool:
        return digest in self._entries

    def users(self, digest: str) -> int:
        e = self._entries.get(digest)
        return 0 if e is None else e.users

    # -- the resolver --------------------------------------------------------------------------------

    async def local_path(self, digest: str) -> Path:
        """The image's verified file, fetched first when the host lacks it; counted as one more user
        until :meth:`release`. ImageUnavailable when it cannot be had."""
        check_digest(digest)
        while True:
            e = self._entries.get(digest)
            if e is not None and e.verified:
                self._use(digest, e, +1)
                return self.path(digest)
            await self.fetch(digest)

    def release(self, digest: str) -> None:
        e = self._entries.get(digest)
        if e is None:
            return
        self._use(digest, e, -1)
        self._evict()

    def hold(self, digest: str) -> bool:
        """Count one more user of an image already on disk, without fetching (a sandbox adopted after a
        restart uses the file it was started from). False when the host does not hold it."""
        e = self._entries.get(check_digest(digest))
        if e is None:
            return False
        self._use(digest, e, +1)
        return True

    def _use(self, digest: str, e: _CachedImage, users: int) -> None:
        e.users = max(0, e.users + users)
        e.used_at = self._tick()
        with contextlib.suppress(OSError):
            os.utime(self.path(digest))  # the order of use, kept across a restart

    # -- fetching ------------------------------------------------------------------------------------

    async def fetch(self, digest: str) -> None:
        """Have the image verified on disk (one transfer however many ask at once); holds no user."""
        task = self._fetching.get(digest)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._fetch(digest), name=f"fetch-{digest[:19]}")
            self._fetching[digest] = task
            task.add_done_callback(lambda _t: self._fetching.pop(digest, None))
        # Shielded: one waiter cancelled (its create abandoned) leaves the transfer to the others.
        await asyncio.shield(task)

    async def prefetch(self, digest: str) -> bool:
        """Fetch ahead of any create (a warm pool's image); False, logged, when it cannot be had."""
        try:
            await self.fetch(digest)
        except ImageUnavailable as exc:
            log.warning("prefetch of %s failed: %s", digest, exc.reason)
            return False
        return True

    async def _fetch(self, digest: str) -> None:
        e = self._entries.get(digest)
        if e is not None and e.verified:
            return
        final = self.path(digest)
        if e is not None:
            # Kept from before a restart: hashed again before it is first used.
            if await asyncio.to_thread(_hashes_to, final, digest):
                e.verified = True
                return
            log.warning("cached image %s does not hash to its name: fetching it again", digest)
            self._entries.pop(digest, None)
            final.unlink(missing_ok=True)
        reason = "no transfer"
        for attempt in range(self.attempts):
            if attempt:
                await asyncio.sleep(self.retry_base_s * 2 ** (attempt - 1))
            self.fetches += 1
            try:
                size = await self._download(digest, final)
            except BlobNotFound:
                raise ImageUnavailable(digest, "no such image in the control plane's store") from None
            except Exception as exc:  # any failed transfer (lost, short, corrupt) is thrown away and retried
                self.refused += 1
                reason = f"{type(exc).__name__}: {exc}"
                log.warning("fetch %d of %s refused: %s", attempt + 1, digest, reason)
                continue
            self._entries[digest] = _CachedImage(size, self._tick())
            self._evict()
            return
        raise ImageUnavailable(digest, f"{self.attempts} transfers failed; last: {reason}")

    async def _download(self, digest: str, final: Path) -> int:
        final.parent.mkdir(parents=True, exist_ok=True)  # made at the first image, not before
        partial = final.with_name(f"{final.name}.{secrets.token_hex(6)}{_PARTIAL}")
        h = hashlib.sha256()
        size = 0
        try:
            with partial.open("wb") as f:
                async for chunk in self.source.read(digest):
                    h.update(chunk)
                    size += len(chunk)
                    await asyncio.to_thread(f.write, chunk)
                await asyncio.to_thread(_sync, f)
            if f"sha256:{h.hexdigest()}" != digest:
                raise ImageCorrupt(f"{size} bytes came that do not hash to {digest}")
            partial.rename(final)
        finally:
            partial.unlink(missing_ok=True)
        return size

    # -- eviction ------------------------------------------------------------------------------------

    def _evict(self) -> None:
        """Delete the least recently used images no sandbox uses until the held ones fit the budget."""
        used = self.used_bytes
        if used <= self.budget_bytes:
            return
        for digest in sorted(self._entries, key=lambda d: self._entries[d].used_at):
            if used <= self.budget_bytes:
                break
            e = self._entries[digest]
            if e.users or digest in self._fetching:
                continue
            del self._entries[digest]
            self.path(digest).unlink(missing_ok=True)
            used -= e.size
            log.info("evicted image %s (%d bytes) to keep within %d", digest, e.size, self.budget_bytes)


def _hashes_to(path: Path, digest: str) -> bool:
    try:
        return digest_file(path) == digest
    except OSError:
        return False


def _sync(f: BinaryIO) -> None:
    f.flush()
    os.fsync(f.fileno())
