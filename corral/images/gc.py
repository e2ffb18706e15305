"""Collecting images no one names: a blob is kept while a template version or a live sandbox names
its digest (a rebuild makes a new image; sandboxes keep the one they started on) and while it is
younger than a grace period (a build that just put it has not recorded it yet)."""

from __future__ import annotations

from collections.abc import Callable, Collection

from corral.images.blobs import BlobStore


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
