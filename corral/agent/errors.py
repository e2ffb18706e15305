"""What an agent says when it will not (or cannot) do what was asked, with a stable code per reason.

The same exception types are raised by the :class:`~corral.agent.agent.Agent` itself, rendered by its
HTTP app, and rebuilt from the response body by :class:`~corral.agent.client.HttpAgentClient`, so a caller
sees the same error whether the agent runs in-process or across the network.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from corral.codes import ErrorCode


class AgentError(Exception):
    """Base of every agent error: ``code`` is stable, ``status`` is the HTTP status it maps to."""

    status: int = 500
    retryable: bool = False
    default_code: str = ErrorCode.INTERNAL

    def __init__(
        self,
        code: str | None = None,
        message: str = "",
        retry_after_s: float | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        self.code = code or self.default_code
        self.message = message or self.code
        self.retry_after_s = retry_after_s
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(f"{self.code}: {self.message}")

    def body(self) -> dict[str, Any]:
        """The error body every corral API answers with."""
        return {
            "error": {
                "code": self.code,
                "message": self.message,
                "retry_after_s": self.retry_after_s,
                "details": self.details,
            }
        }


class AgentRefusal(AgentError):
    """Not now, not here: retry later or on another host. Never a sign that the host is dead."""

    status = 503
    retryable = True
    default_code = ErrorCode.HOST_DOES_NOT_FIT

    def __init__(
        self,
        code: str | None = None,
        message: str = "",
        retry_after_s: float | None = 1.0,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message, 1.0 if retry_after_s is None else retry_after_s, details)


class AgentSandboxNotFound(AgentError):
    status = 404
    default_code = ErrorCode.NOT_FOUND


class AgentCommandNotFound(AgentSandboxNotFound):
    """No background command of that pid in the sandbox (never started there, or ended long enough
    ago to be forgotten). ``details["pid"]`` tells it from the sandbox's own 404 across the wire."""


class AgentConflict(AgentError):
    status = 409
    default_code = ErrorCode.SANDBOX_EXISTS


class AgentWarmEmpty(AgentConflict):
    """No ready warm sandbox of the template is left here: the caller tries another host or starts
    one cold. Answered at once, never waited for."""

    default_code = ErrorCode.WARM_EMPTY


class AgentInvalid(AgentError):
    """Bad input; ``details["field"]`` names the field."""

    status = 422
    default_code = ErrorCode.INVALID_REQUEST


class AgentUnauthorized(AgentError):
    status = 401
    default_code = ErrorCode.UNAUTHORIZED


class AgentRuntimeError(AgentError):
    """The runtime failed at something other than a start (a start failure is a refusal)."""

    status = 502
    default_code = ErrorCode.RUNTIME_FAILED


class AgentBusy(AgentError):
    """Too many of this sandbox's calls are in flight here; ``details`` says the scope, the limit and
    what holds it. The same call succeeds once one of its own ends: 429 with Retry-After, and never a
    sign that the host is unwell (the create flow does not try elsewhere for it)."""

    status = 429
    default_code = ErrorCode.TOO_MANY_CONCURRENT


class AgentUnavailable(AgentError):
    """The agent could not be reached, or answered with something that is not an agent's answer."""

    status = 503
    retryable = True
    default_code = ErrorCode.AGENT_UNAVAILABLE


_BY_STATUS: dict[int, type[AgentError]] = {
    401: AgentUnauthorized,
    404: AgentSandboxNotFound,
    409: AgentConflict,
    422: AgentInvalid,
    429: AgentBusy,
    502: AgentRuntimeError,
}


def error_from_response(status: int, body: object) -> AgentError:
    """Rebuild the agent's error from an HTTP answer; anything unrecognisable is ``AgentUnavailable``."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("code"), str):
        return AgentUnavailable(message=f"agent answered HTTP {status} without an error body")
    code: str = err["code"]
    message = str(err.get("message") or code)
    raw_retry = err.get("retry_after_s")
    retry = float(raw_retry) if isinstance(raw_retry, int | float) else None
    details = err.get("details") if isinstance(err.get("details"), dict) else {}
    if status == 503:
        if code == ErrorCode.AGENT_UNAVAILABLE:
            return AgentUnavailable(code, message, retry, details)
        return AgentRefusal(code, message, retry, details)
    if status == 409 and code == ErrorCode.WARM_EMPTY:
        return AgentWarmEmpty(code, message, retry, details)
    if status == 404 and isinstance(details, dict) and "pid" in details:
        return AgentCommandNotFound(code, message, retry, details)
    cls = _BY_STATUS.get(status)
    if cls is None:
        return AgentError(code, message, retry, details)
    return cls(code, message, retry, details)
