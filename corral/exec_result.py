"""The outcome of one command run inside a sandbox: one shape from the runtime that ran it, through the
host agent's answer and the API's, to the SDK's return value.

Like ``corral.codes`` it sits below every layer, so the runtime, the agent, the API and the SDK all
import it; it needs only pydantic, which the SDK depends on anyway. Fields a newer server adds are
ignored, so an older SDK keeps parsing.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

# A command's own timeout when its caller names none, and the most it may name: every layer's own
# wait for the answer (agent, replica, SDK) follows the command's timeout plus ANSWER_MARGIN_S.
DEFAULT_EXEC_TIMEOUT_S = 30.0
MAX_EXEC_TIMEOUT_S = 3600.0
ANSWER_MARGIN_S = 10.0
# A streamed command that writes nothing still sends an empty line this often, so that no proxy or
# reader on the way takes the silence for a dead connection.
KEEPALIVE_S = 10.0


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
    # The kernel's out-of-memory killer ended the command (its sandbox reached its memory limit while
    # it ran, and it died of SIGKILL). Added later than the fields above.
    oom_killed: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class ExecOutput(BaseModel):
    """Output of a streamed command, as it came (decoded as UTF-8, undecodable bytes replaced)."""

    model_config = ConfigDict(frozen=True)

    stream: Literal["stdout", "stderr"]
    text: str


class ExecStreamError(BaseModel):
    """A streamed command's answer ended by an error after its output began (its host went away)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    code: str
    message: str


ExecEvent = ExecOutput | ExecResult | ExecStreamError

# The streamed exec's wire form: one JSON object a line (``application/x-ndjson``): ``{"stdout": T}``,
# ``{"stderr": T}``, an empty ``{}`` (a keepalive), and last ``{"result": R}`` or ``{"error": E}``.
STREAM_MEDIA_TYPE = "application/x-ndjson"


def encode_event(event: ExecEvent | None) -> bytes:
    body: dict[str, Any]
    if event is None:
        body = {}
    elif isinstance(event, ExecOutput):
        body = {event.stream: event.text}
    elif isinstance(event, ExecResult):
        body = {"result": event.model_dump(mode="json")}
    else:
        body = {"error": event.model_dump(mode="json")}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def decode_event(line: str | bytes) -> ExecEvent | None:
    """One line of a streamed exec: its event, None for a keepalive; ValueError for anything else."""
    try:
        body = json.loads(line)
    except ValueError as exc:
        raise ValueError(f"not a line of a streamed exec: {line[:80]!r}") from exc
    if not isinstance(body, dict):
        raise ValueError(f"not a line of a streamed exec: {line[:80]!r}")
    try:
        for stream in ("stdout", "stderr"):
            if isinstance(body.get(stream), str):
                return ExecOutput(stream=stream, text=body[stream])
        if "result" in body:
            return ExecResult.model_validate(body["result"])
        if "error" in body:
            return ExecStreamError.model_validate(body["error"])
    except ValidationError as exc:
        raise ValueError(f"a streamed exec's line does not parse: {exc}") from exc
    return None
