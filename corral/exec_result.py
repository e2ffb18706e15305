"""The outcome of one command run inside a sandbox: one shape from the runtime that ran it, through the
host agent's answer and the API's, to the SDK's return value.

Like ``corral.codes`` it sits below every layer, so the runtime, the agent, the API and the SDK all
import it; it needs only pydantic, which the SDK depends on anyway. Fields a newer server adds are
ignored, so an older SDK keeps parsing.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    duration_ms: float = 0.0
    # Output past the runtime's cap was cut off.
    truncated: bool = False
    # The command outlived its timeout and was killed.
    timed_out: bool = False
    # What happened to the command besides its own doing, in words, or None: its output was cut off
    # (the rest refused, so its writer found the pipe closed), or its sandbox was paused while it ran.
    # Added later than the fields above: an older server never sends it.
    note: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0
