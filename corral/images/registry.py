"""A recipe's FROM naming a container registry's image (``python:3.12-slim``,
``registry.example/team/app:1``): pulled with ``skopeo`` (a Debian package) into an OCI archive, which
the builder imports as the recipe's base (its layers applied in order, whiteouts honoured, the same
fix-ups and confinement as any import).

Without skopeo, or when the registry does not answer, such a FROM is refused before the build starts
(``registry_unavailable``). A registry on loopback (``localhost:5000/...``, ``127.0.0.1:5000/...``) is
spoken to over plain HTTP, as a local test registry serves; any other over TLS, verified.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
from pathlib import Path

# A reference as the distribution spec writes one: an optional host[:port]/, path components, an
# optional tag and digest. Nothing else reaches skopeo's command line.
REFERENCE = re.compile(
    r"^(?:(?P<host>[A-Za-z0-9.-]+(?::[0-9]{1,5})?|\[::1\](?::[0-9]{1,5})?)/)?"
    r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?$"
)
LOOPBACK = ("localhost", "127.0.0.1", "[::1]")
MAX_REFERENCE = 255
CHECK_TIMEOUT_S = 15.0
TAIL = 2000


class RegistryError(Exception):
    """The image cannot be had: no skopeo, no registry answering, or no such image."""


def unavailable_reason() -> str | None:
    if shutil.which("skopeo") is None:
        return "pulling from a container registry needs skopeo on the control plane's machine"
    return None


def is_reference(name: str) -> bool:
    return len(name) <= MAX_REFERENCE and REFERENCE.match(name) is not None


def _tls(ref: str, flag: str) -> list[str]:
    """Plain HTTP (``flag=false``) for a registry on loopback; TLS, verified, for any other."""
    found = REFERENCE.match(ref)
    host = (found.group("host") if found else None) or ""
    name = host.split("]")[0] + "]" if host.startswith("[") else host.rsplit(":", 1)[0]
    return [f"{flag}=false"] if name in LOOPBACK else []


async def _skopeo(args: list[str], timeout_s: float) -> None:
    proc = await asyncio.create_subprocess_exec(
        "skopeo",
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        _, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except BaseException:  # past its time, or the build cancelled: skopeo goes with it
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        text = err.decode(errors="replace").strip()
        found = re.search(r'msg="(.*)"', text)
        raise RegistryError((found.group(1) if found else text)[-TAIL:] or f"skopeo exited {proc.returncode}")


async def check(ref: str, timeout_s: float = CHECK_TIMEOUT_S) -> None:
    """Whether the registry answers for ``ref`` (RegistryError saying why not)."""
    reason = unavailable_reason()
    if reason is not None:
        raise RegistryError(reason)
    if not is_reference(ref):
        raise RegistryError(f"{ref[:200]!r} is not an image reference")
    try:
        await _skopeo(["inspect", "--raw", *_tls(ref, "--tls-verify"), f"docker://{ref}"], timeout_s)
    except TimeoutError:
        raise RegistryError(f"the registry of {ref[:200]!r} did not answer within {timeout_s:g} s") from None


async def pull(ref: str, dest: Path, timeout_s: float) -> Path:
    """``ref``'s image as an OCI archive at ``dest``."""
    if not is_reference(ref):
        raise RegistryError(f"{ref[:200]!r} is not an image reference")
    try:
        await _skopeo(
            ["copy", "--quiet", *_tls(ref, "--src-tls-verify"), f"docker://{ref}", f"oci-archive:{dest}"],
            timeout_s,
        )
    except TimeoutError:
        raise RegistryError(f"pulling {ref[:200]!r} ran past {timeout_s:g} s") from None
    return dest
