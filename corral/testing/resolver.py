"""An :class:`corral.images.ImageResolver` over a dict of digests to local image files: the runtime's
tests hand it the files they built; the agent's image cache is the real one."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


class UnknownImage(LookupError):
    pass


class DictResolver:
    def __init__(self, images: dict[str, Path] | None = None) -> None:
        self.images = dict(images or {})
        self.asked: Counter[str] = Counter()  # local_path calls per digest
        self.held: Counter[str] = Counter()  # users per digest not yet released

    def add(self, digest: str, path: Path) -> None:
        self.images[digest] = path

    async def local_path(self, digest: str) -> Path:
        self.asked[digest] += 1
        try:
            path = self.images[digest]
        except KeyError:
            raise UnknownImage(f"no image {digest} on this host") from None
        self.held[digest] += 1
        return path

    def release(self, digest: str) -> None:
        if self.held[digest] <= 0:
            raise AssertionError(f"{digest} released more often than it was resolved")
        self.held[digest] -= 1
