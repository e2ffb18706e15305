"""Content addresses: ``sha256:<64 hex>`` of an image file's bytes, the one name an image has."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
_DIGEST = re.compile(DIGEST_PATTERN)
_CHUNK = 1 << 20


def check_digest(text: str) -> str:
    """``text`` when it is a well-formed digest, else ValueError (a digest names a path on disk)."""
    if not _DIGEST.fullmatch(text):  # `$` alone would let a trailing newline through
        raise ValueError(f"not an image digest: {text[:80]!r}")
    return text


def digest_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return f"sha256:{h.hexdigest()}"
