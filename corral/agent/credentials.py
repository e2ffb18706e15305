"""Reading a host's credentials file (``corral agent --token-file FILE``): the shape enrolment hands
out (:class:`corral.shapes.hosts.HostCredentials`), in a file only its owner may read, since it holds
both secrets.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import ValidationError

from corral.shapes.hosts import HostCredentials


class BadCredentials(ValueError):
    pass


def load(path: Path) -> HostCredentials:
    """Read a credentials file; refuse one that others than its owner may read (as ssh refuses a
    private key) or that is not one."""
    try:
        mode = os.stat(path).st_mode
        text = path.read_text()
    except OSError as exc:
        raise BadCredentials(f"{path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise BadCredentials(f"{path}: readable by others (mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    try:
        return HostCredentials.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "file"
        raise BadCredentials(f"{path}: not a host credentials file ({where}: {first['msg']})") from exc
