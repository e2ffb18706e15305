"""Background commands as the API describes them: a command started in a sandbox that outlives the
request that started it (``POST /v1/sandboxes/{id}/commands``), its state, and the output its host kept.

The same shapes travel from the host agent through a replica to the SDK: the agent builds them, every
hop passes them on as they are.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from corral.exec_result import ExecResult
from corral.shapes import Wire

CommandState = Literal["running", "ended"]


class CommandInfo(Wire):
    """One background command: its handle (``pid``, unique within its sandbox while its host keeps
    the command) and how it is doing."""

    pid: int
    sandbox_id: str
    command: list[str]
    started_at: datetime
    # "running", then "ended" once it has exited (by itself, its timeout, a kill or its sandbox's end).
    state: CommandState = "running"
    timeout_s: float = 0.0
    exit_code: int | None = None  # None while it runs
    ended_at: datetime | None = None
    duration_ms: float | None = None
    timed_out: bool = False
    killed: bool = False  # ended by a kill call (or its sandbox's end)
    oom_killed: bool = False
    note: str | None = None
    # Output bytes it wrote to each stream, and how many of those its host no longer keeps (only the
    # last bytes of each stream are kept: see ``corral.agent.commands``).
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    stdout_dropped_bytes: int = 0
    stderr_dropped_bytes: int = 0

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def dropped_bytes(self) -> int:
        return self.stdout_dropped_bytes + self.stderr_dropped_bytes

    def result(self, stdout: str = "", stderr: str = "") -> ExecResult | None:
        """How it ended, as an exec's result with the given output; None while it runs."""
        if self.exit_code is None:
            return None
        return ExecResult(
            exit_code=self.exit_code,
            stdout=stdout,
            stderr=stderr,
            duration_ms=self.duration_ms or 0.0,
            truncated=self.dropped_bytes > 0,
            timed_out=self.timed_out,
            note=self.note,
            oom_killed=self.oom_killed,
        )


class CommandList(Wire):
    """A sandbox's background commands, by pid: those running and the last few that ended."""

    commands: list[CommandInfo] = Field(default_factory=list)


class CommandOutput(Wire):
    """What a background command's host kept of its output: the last bytes of each stream (decoded
    as UTF-8, undecodable bytes replaced), and the command as it was when they were read."""

    command: CommandInfo
    stdout: str = ""
    stderr: str = ""
