"""What an image says of how its sandboxes run, beside its bytes (E2B's semantics: a sandbox is ready
when its ready command succeeds; its start command runs in the background from the start)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_USER = "user"
DEFAULT_WORKDIR = "/home/user"
# A user name as the image's /etc/passwd may hold it (and as a start names it: no path, no shell).
USER_PATTERN = r"^[a-z_][a-z0-9_-]{0,31}$"


@dataclass(frozen=True, slots=True)
class ImageConfig:
    env: Mapping[str, str] = field(default_factory=dict)
    user: str = DEFAULT_USER
    workdir: str = DEFAULT_WORKDIR
    start_cmd: str | None = None
    ready_cmd: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "env": dict(self.env),
            "user": self.user,
            "workdir": self.workdir,
            "start_cmd": self.start_cmd,
            "ready_cmd": self.ready_cmd,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ImageConfig:
        return cls(
            env=dict(data.get("env") or {}),
            user=str(data.get("user") or DEFAULT_USER),
            workdir=str(data.get("workdir") or DEFAULT_WORKDIR),
            start_cmd=data.get("start_cmd"),
            ready_cmd=data.get("ready_cmd"),
        )
