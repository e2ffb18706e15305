"""Images as this replica serves them to the hosts: the bytes of one digest, streamed from the blob
store every replica shares (a host fetches an image through whichever replica it reaches)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from corral.control.errors import ImageNotFound
from corral.images import BlobNotFound, BlobStore, check_digest


@dataclass(frozen=True, slots=True)
class ImageStream:
    digest: str
    size: int
    chunks: AsyncIterator[bytes]


class ImageBlobs:
    """``blobs`` None: this replica keeps no images (every fetch is a 404 ``image_not_found``)."""

    def __init__(self, blobs: BlobStore | None) -> None:
        self.blobs = blobs

    async def open(self, digest: str) -> ImageStream:
        """The image's length and its bytes, or :class:`ImageNotFound` before any byte is sent."""
        check_digest(digest)
        if self.blobs is None:
            raise ImageNotFound(f"no image {digest}: this control plane keeps no images")
        try:
            size = await self.blobs.size(digest)
        except BlobNotFound:
            raise ImageNotFound(f"no image {digest}") from None
        return ImageStream(digest, size, self.blobs.read(digest))
