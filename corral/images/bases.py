"""corral's bases: root filesystems made from Debian's archive with ``mmdebstrap``, kept as tarballs
(built once per host, under a lock so concurrent first builds make one), named as a recipe's FROM
names them. E2B's base images map onto these (see :data:`ALIASES`)."""

from __future__ import annotations

import asyncio
import fcntl
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class BaseSpec:
    suite: str
    packages: tuple[str, ...]
    variant: str = "minbase"

    def file_name(self) -> str:
        return f"base-{self.suite}-{self.variant}-{'-'.join(self.packages)}.tar"


DEBIAN = BaseSpec("bookworm", ("sudo",))
PYTHON = BaseSpec(
    "bookworm",
    ("sudo", "python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates", "curl", "git"),
)
BASES: Mapping[str, BaseSpec] = {"debian:bookworm": DEBIAN, "python": PYTHON}
# Other names for the same bases (Docker Hub's and E2B's spellings).
ALIASES: Mapping[str, str] = {
    "debian": "debian:bookworm",
    "debian:12": "debian:bookworm",
    "ubuntu": "debian:bookworm",
    "python:3": "python",
    "python:3.11": "python",
    "e2bdev/base": "python",
    "e2bdev/code-interpreter": "python",
}


def canonical(name: str) -> str | None:
    """The base a FROM names, or None when it names none (then it may name a template)."""
    name = ALIASES.get(name, name)
    return name if name in BASES else None


def debootstrap(target: Path, spec: BaseSpec) -> Path:
    """``target``: the tarball of ``spec``'s root, built with mmdebstrap unless it is there already."""
    if target.exists():
        return target
    if shutil.which("mmdebstrap") is None:
        raise RuntimeError("mmdebstrap is missing: `make system-deps` installs it")
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.with_name(f"{target.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = target.with_suffix(".partial.tar")
            subprocess.run(
                [
                    "mmdebstrap",
                    "--quiet",
                    f"--variant={spec.variant}",
                    f"--include={','.join(spec.packages)}",
                    spec.suite,
                    str(partial),
                ],
                check=True,
                stdin=subprocess.DEVNULL,
            )
            partial.rename(target)
    return target


class Bases:
    """The bases of one host: tarballs under ``cache`` (or ``prebuilt`` ones, by canonical name)."""

    def __init__(self, cache: Path, prebuilt: Mapping[str, Path] | None = None) -> None:
        self.cache = cache
        self.prebuilt = dict(prebuilt or {})

    async def tarball(self, name: str) -> Path:
        base = canonical(name)
        if base is None:
            raise KeyError(name)
        if base in self.prebuilt:
            return self.prebuilt[base]
        spec = BASES[base]
        return await asyncio.to_thread(debootstrap, self.cache / spec.file_name(), spec)
