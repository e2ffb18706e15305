"""Where image bytes live, behind one interface: a directory for ``corral serve``, PostgreSQL for
replicas on PostgreSQL (any replica serves any image), and room for an S3-compatible store."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol


class BlobNotFound(Exception):
    """No blob of that digest is stored."""


class BlobStore(Protocol):
    async def put(self, digest: str, source: Path) -> None:
        """Store ``source``'s bytes under ``digest``; ValueError (storing nothing) when they do not
        hash to it. Idempotent: a digest already stored is left as it is."""
        ...

    async def has(self, digest: str) -> bool: ...

    async def size(self, digest: str) -> int:
        """The blob's length in bytes; BlobNotFound when absent."""
        ...

    def read(self, digest: str) -> AsyncIterator[bytes]:
        """The blob's bytes in chunks; BlobNotFound (on first iteration) when absent."""
        ...

    async def delete(self, digest: str) -> None:
        """Forget the blob; absent is not an error."""
        ...

    async def digests(self) -> list[str]: ...
