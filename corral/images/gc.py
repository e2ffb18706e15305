"""Collecting images no one names: a blob is kept while a template version or a live sandbox names
its digest (a rebuild makes a new image; sandboxes keep the one they started on) and while it is
younger than a grace period (a build that just put it has not recorded it yet)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

from corral.images.blobs import BlobStore

log = logging.getLogger("corral.images.gc")


async def collect_unreferenced(
    blobs: BlobStore,
    referenced: Collection[str],
    *,
    is_young: Callable[[str], bool] = lambda _digest: False,
) -> list[str]:
    """Delete every blob ``referenced`` does not name (and ``is_young`` does not protect); the
    digests deleted, sorted."""
    keep = set(referenced)
    gone = [d for d in await blobs.digests() if d not in keep and not is_young(d)]
    for digest in gone:
        await blobs.delete(digest)
    return sorted(gone)


class ImageCollector:
    """The leader's periodic sweep: an image no one names is deleted once a sweep at least ``grace_s``
    after the first that found it unnamed still finds it so (a build names its image moments after
    putting it; a blob store keeps no ages, so the grace is counted here)."""

    def __init__(
        self,
        blobs: BlobStore,
        referenced: Callable[[], Awaitable[Collection[str]]],
        now: Callable[[], float],
        grace_s: float = 600.0,
    ) -> None:
        self.blobs = blobs
        self.referenced = referenced
        self.now = now
        self.grace_s = grace_s
        self._unnamed_since: dict[str, float] = {}
        self._last = float("-inf")

    async def tick(self, every_s: float = 60.0) -> list[str]:
        """A sweep when ``every_s`` have passed since the last (the leader's rounds are far more often);
        a failed sweep (the store or the blobs unreachable) is tried again next time."""
        if self.now() - self._last < every_s:
            return []
        self._last = self.now()
        try:
            return await self.sweep()
        except Exception:
            log.warning("image collection failed; tried again next round", exc_info=True)
            return []

    async def sweep(self) -> list[str]:
        """One sweep; the digests deleted."""
        named = set(await self.referenced())
        now = self.now()
        stored = set(await self.blobs.digests())
        unnamed = stored - named
        self._unnamed_since = {d: self._unnamed_since.get(d, now) for d in unnamed}
        gone = await collect_unreferenced(
            self.blobs, named, is_young=lambda d: now - self._unnamed_since.get(d, now) < self.grace_s
        )
        for digest in gone:
            self._unnamed_since.pop(digest, None)
        return gone
