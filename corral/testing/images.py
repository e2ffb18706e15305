"""A small Debian root for tests, built once per machine and reused by every test and run.

``mmdebstrap --variant=minbase`` of bookworm with ``sudo`` (about 17 s and 180 MB here), kept as a
tarball under the cache directory (``CORRAL_TEST_CACHE``, else ``~/.cache/corral-test``). A lock file
makes concurrent first callers (pytest workers, parallel runs) build it once. Bigger bases (python3 and
friends) are benchmarks and ``make`` targets, not tests.
"""

from __future__ import annotations

import os
from pathlib import Path

from corral.images.bases import DEBIAN, debootstrap

SUITE = DEBIAN.suite
PACKAGES = DEBIAN.packages


def cache_dir() -> Path:
    root = Path(os.environ.get("CORRAL_TEST_CACHE") or Path.home() / ".cache" / "corral-test")
    root.mkdir(parents=True, exist_ok=True)
    return root


def small_base() -> Path:
    """The tarball of the small base (a root filesystem, owners and modes kept)."""
    return debootstrap(cache_dir() / DEBIAN.file_name(), DEBIAN)
