"""A host's cache of build layers: one directory per layer (an overlay upper: the files the step
changed, whiteouts for the ones it removed), keyed by (parent layer, step), so a rebuild reruns only
the steps after the first that changed.

A layer's key is the sha256 of its parent's key and its step's canonical text (plus, for a COPY, the
digest of what it copied). Its files are owned by the build's uid range (see :mod:`corral.images.jail`)
under a directory only the host's root may enter. A layer is made beside its final name and renamed
into place, so a crashed build leaves a partial directory (removed at the next open), never a layer.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

_PARTIAL = ".partial"


def layer_key(parent: str | None, step_text: str) -> str:
    return hashlib.sha256(json.dumps([parent, step_text]).encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LayerInfo:
    key: str
    parent: str | None
    step: str  # the recipe line (or base) that made it, for logs


class LayerCache:
    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        for stale in root.glob(f"*{_PARTIAL}*"):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def path(self, key: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a layer key: {key[:80]!r}")
        return self.root / key

    def has(self, key: str) -> bool:
        return (self.root / f"{key}.json").exists() and self.path(key).is_dir()

    def info(self, key: str) -> LayerInfo:
        data = json.loads((self.root / f"{key}.json").read_text())
        return LayerInfo(key=key, parent=data["parent"], step=data["step"])

    def chain(self, key: str) -> list[str]:
        """The overlay's lower directories for a step on top of ``key``: topmost first."""
        dirs: list[str] = []
        current: str | None = key
        while current is not None:
            dirs.append(str(self.path(current)))
            current = self.info(current).parent
        return dirs

    def partial(self) -> Path:
        """An empty directory to make a layer in (the root of the layer belongs to the build)."""
        path = self.root / f"{uuid.uuid4().hex}{_PARTIAL}"
        path.mkdir()
        return path

    def commit(self, partial: Path, info: LayerInfo) -> None:
        final = self.path(info.key)
        if self.has(info.key):  # another build made the same layer meanwhile: keep the first
            shutil.rmtree(partial, ignore_errors=True)
            return
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
        meta = self.root / f"{info.key}.json{_PARTIAL}"
        meta.write_text(json.dumps({"parent": info.parent, "step": info.step}))
        meta.rename(self.root / f"{info.key}.json")

    def keys(self) -> list[str]:
        return sorted(p.name.removesuffix(".json") for p in self.root.glob("*.json"))

    def drop(self, key: str) -> None:
        (self.root / f"{key}.json").unlink(missing_ok=True)
        shutil.rmtree(self.path(key), ignore_errors=True)
