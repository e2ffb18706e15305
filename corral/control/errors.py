"""The control plane's answers that are not a sandbox, each with the stable code and HTTP status of
DESIGN.md's table. The API renders them; nothing else decides a status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ControlError(Exception):
    code = "internal"
    status = 500

    def __init__(
        self,
        message: str = "",
        *,
        code: str | None = None,
        retry_after_s: float | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        if code is not None:
            self.code = code
        self.message = message or self.code
        self.retry_after_s = retry_after_s
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(self.message)


class Unavailable(ControlError):
    """503: retry. ``no_capacity``, ``no_healthy_hosts`` or ``store_unavailable``; always with a
    Retry-After estimated from the fleet."""

    code = "no_capacity"
    status = 503


class InvalidRequest(ControlError):
    code = "invalid_request"
    status = 422

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, details={"field": field})


class Unauthorized(ControlError):
    code = "unauthorized"
    status = 401


class Forbidden(ControlError):
    code = "forbidden"
    status = 403


class NotFound(ControlError):
    code = "not_found"
    status = 404


class Conflict(ControlError):
    code = "name_conflict"
    status = 409


class HostBusy(ControlError):
    """A host cannot be forgotten while live sandboxes are on it."""

    code = "host_has_sandboxes"
    status = 409


class PayloadTooLarge(ControlError):
    """The request's body is over its route's cap; refused before it is read in full."""

    code = "payload_too_large"
    status = 413


class Gone(ControlError):
    code = "sandbox_orphaned"
    status = 410


class OverQuota(ControlError):
    code = "tenant_over_quota"
    status = 429


class QueueFull(ControlError):
    """A tenant already has as many creates waiting for capacity as it may."""

    code = "queue_full"
    status = 429


class BadGateway(ControlError):
    """The sandbox's host answered with an error that is not the caller's fault."""

    code = "agent_error"
    status = 502


class NotRunning(ControlError):
    """The sandbox exists but is not in a state that can run a command."""

    code = "sandbox_not_running"
    status = 409
