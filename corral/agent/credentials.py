"""A host's credentials, as enrolment hands them out (``POST /v1/hosts/{id}/token``, ``corral hosts
token ID --out FILE``) and as ``corral agent --token-file FILE`` reads them back.

``agent_token`` is what the agent presents to the control plane (heartbeats; it speaks for this host
only). ``host_key`` is what the control plane presents to the agent; the agent refuses every call
without it. The file holds both secrets, so it must be readable by its owner only.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.agent.protocol import ID_PATTERN


class HostCredentials(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    host_id: str = Field(pattern=ID_PATTERN)
    agent_token: str = Field(min_length=16, max_length=512)
    host_key: str = Field(min_length=16, max_length=512)


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
