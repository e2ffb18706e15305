"""The seam between a host's image cache and its runtime: the runtime asks for a digest's file on
local disk and gets it once it is there (fetched and verified first, when the host lacked it)."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol


class ImageResolver(Protocol):
    async def local_path(self, digest: str) -> Path:
        """The erofs file of ``digest`` on this host, verified; raises when it cannot be had."""
        ...

    def release(self, digest: str) -> None:
        """One user of ``digest`` is done with it (a cache may evict only what no sandbox uses)."""
        ...
