"""Older e2b SDKs, each in a small venv of its own made on first use and kept in the test cache (the
suite's own venv holds the pinned 2.63.0; an older SDK's dependencies differ, so it cannot share it)."""

from __future__ import annotations

import fcntl
import subprocess
import sys
from pathlib import Path

from corral.testing.images import cache_dir


def sdk_python(version: str) -> Path:
    """The interpreter of a venv holding ``e2b==version`` alone, made once per machine (from PyPI)."""
    venv = cache_dir() / f"e2b-sdk-{version}"
    python, stamp = venv / "bin" / "python", venv / ".installed"
    with (cache_dir() / f"e2b-sdk-{version}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes on one machine make it once
        if not stamp.exists():
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"e2b=={version}"],
                check=True,
            )
            stamp.touch()
    return python
