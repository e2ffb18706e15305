"""What a sandbox does when its timeout comes (E2B's ``lifecycle``): it is killed (the default), or
paused, with its memory kept or with its files alone kept (the next start is then a reboot: nothing
that ran runs, what was written is there); and whether a paused one wakes on its next data-plane call
(auto-resume) or only on an explicit resume. A record keeps it as short canonical text."""

from __future__ import annotations

import json
from dataclasses import dataclass

ON_TIMEOUT_KILL = "kill"
ON_TIMEOUT_PAUSE = "pause"
ON_TIMEOUT = (ON_TIMEOUT_KILL, ON_TIMEOUT_PAUSE)
# How a paused sandbox was paused: frozen with its memory, or emptied of its processes (files kept).
PAUSED_MEMORY = "memory"
PAUSED_FILESYSTEM = "filesystem"
PAUSED_KINDS = (PAUSED_MEMORY, PAUSED_FILESYSTEM)


class LifecycleError(ValueError):
    """A lifecycle no sandbox can have (auto-resume without a pause that keeps memory...)."""


@dataclass(frozen=True, slots=True)
class Lifecycle:
    on_timeout: str = ON_TIMEOUT_KILL
    keep_memory: bool = True  # a timeout's pause keeps the memory (else only the files)
    auto_resume: bool = False  # a paused sandbox wakes on its next data-plane call
    # The timeout an auto-resume sets again (the one it was created with); None: the caller's default.
    timeout_s: float | None = None

    def check(self) -> None:
        if self.on_timeout not in ON_TIMEOUT:
            raise LifecycleError(f"on_timeout: one of {', '.join(ON_TIMEOUT)}")
        if self.auto_resume and self.on_timeout != ON_TIMEOUT_PAUSE:
            raise LifecycleError("auto_resume: only with on_timeout pause")
        if self.auto_resume and not self.keep_memory:
            raise LifecycleError("auto_resume: not with a pause that keeps only the files")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise LifecycleError("timeout_s: must be positive")

    @property
    def pause_kind(self) -> str:
        return PAUSED_MEMORY if self.keep_memory else PAUSED_FILESYSTEM

    def text(self) -> str | None:
        """The record's form: None for the default (killed at its timeout), else canonical JSON."""
        self.check()
        if self == Lifecycle(timeout_s=self.timeout_s):
            return None
        body = {
            "on_timeout": self.on_timeout,
            "keep_memory": self.keep_memory,
            "auto_resume": self.auto_resume,
            "timeout_s": self.timeout_s,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None) -> Lifecycle:
        if text is None:
            return cls()
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or set(data) != {
                "on_timeout",
                "keep_memory",
                "auto_resume",
                "timeout_s",
            }:
                raise LifecycleError("not a lifecycle object")
            timeout = data["timeout_s"]
            if not (
                isinstance(data["on_timeout"], str)
                and isinstance(data["keep_memory"], bool)
                and isinstance(data["auto_resume"], bool)
                and (timeout is None or (isinstance(timeout, int | float) and not isinstance(timeout, bool)))
            ):
                raise LifecycleError("a field of the wrong type")
            found = cls(data["on_timeout"], data["keep_memory"], data["auto_resume"], timeout)
        except json.JSONDecodeError as exc:
            raise LifecycleError(str(exc)) from None
        if found.text() != text:
            raise LifecycleError("not in canonical form (use Lifecycle.text)")
        return found


def check_paused(paused: str | None) -> None:
    if paused is not None and paused not in PAUSED_KINDS:
        raise LifecycleError(f"paused: None or one of {', '.join(PAUSED_KINDS)}")
