"""The blob store of ``corral serve``: one file per digest in a directory, written beside and renamed
into place once its bytes hash to the digest, so a reader never sees half a blob and a crash leaves
only a temporary file (removed at the next open)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path

from corral.images.blobs import BlobNotFound
from corral.images.digest import check_digest

_CHUNK = 1 << 20
_PARTIAL = ".partial"


class DirBlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(f"*{_PARTIAL}"):
            stale.unlink(missing_ok=True)

    def path(self, digest: str) -> Path:
        """Where ``digest``'s bytes are (a digest names a path: it is checked before it is used)."""
        return self.root / check_digest(digest).replace(":", "-")

    async def put(self, digest: str, source: Path) -> None:
        await asyncio.to_thread(self._put, digest, source)

    def _put(self, digest: str, source: Path) -> None:
        final = self.path(digest)
        if final.exists():
            return
        # Its own name per put: two puts of one digest at once (one source, even) never share a file.
        partial = final.with_name(f"{final.name}.{os.getpid()}.{secrets.token_hex(8)}{_PARTIAL}")
        h = hashlib.sha256()
        try:
            with source.open("rb") as src, partial.open("wb") as dst:
                while chunk := src.read(_CHUNK):
                    h.update(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if f"sha256:{h.hexdigest()}" != digest:
                raise ValueError(f"bytes of {source.name} do not hash to {digest}")
            partial.rename(final)
        finally:
            partial.unlink(missing_ok=True)

    async def has(self, digest: str) -> bool:
        return self.path(digest).exists()

    async def size(self, digest: str) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(digest) from None

    async def read(self, digest: str) -> AsyncIterator[bytes]:
        try:
            f = self.path(digest).open("rb")
        except FileNotFoundError:
            raise BlobNotFound(digest) from None
        with f:
            while chunk := await asyncio.to_thread(f.read, _CHUNK):
                yield chunk

    async def delete(self, digest: str) -> None:
        self.path(digest).unlink(missing_ok=True)

    async def digests(self) -> list[str]:
        return sorted(
            p.name.replace("-", ":", 1)
            for p in self.root.iterdir()
            if p.name.startswith("sha256-") and _PARTIAL not in p.name
        )
