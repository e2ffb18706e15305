"""Images: the read-only root filesystems templates name, identified by the digest of their bytes.

One image is one erofs file (a whole root, flattened) and its :class:`ImageConfig`. erofs over
squashfs: packing is what a rebuild waits on, and mkfs.erofs (lz4) packs a Debian root in about a
second where mksquashfs (zstd) takes twenty; both are read-only, compressed, mounted by the kernel
once per host and shared through the page cache by every sandbox of the image.
"""

from corral.images.blobs import BlobNotFound, BlobStore
from corral.images.config import ImageConfig
from corral.images.digest import DIGEST_PATTERN, check_digest, digest_file
from corral.images.dirstore import DirBlobStore
from corral.images.resolver import ImageResolver

__all__ = [
    "DIGEST_PATTERN",
    "BlobNotFound",
    "BlobStore",
    "DirBlobStore",
    "ImageConfig",
    "ImageResolver",
    "check_digest",
    "digest_file",
]
