"""The control plane's answers that are not a sandbox, each with its stable code and that code's HTTP
status (both from ``corral.codes``). The API renders them; nothing else decides a status."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from corral.codes import ErrorCode, status_of


class ControlError(Exception):
    code: str = ErrorCode.INTERNAL
    # The HTTP status of the class's code, looked up once per class: an instance that carries another
    # code (an agent's, passed through) still answers with its class's status.
    status: ClassVar[int] = 500

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.status = status_of(cls.code, cls.status)

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

    code = ErrorCode.NO_CAPACITY


class InvalidRequest(ControlError):
    code = ErrorCode.INVALID_REQUEST

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, details={"field": field})


class UnsupportedOption(ControlError):
    """400: a request asks for something this control plane does not do (rather than dropping it)."""

    code = ErrorCode.UNSUPPORTED_OPTION

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, details={"field": field})


class UnsupportedOperation(ControlError):
    """501: a call this control plane does not serve at all (not a missing resource)."""

    code = ErrorCode.UNSUPPORTED_OPERATION


class Unauthorized(ControlError):
    code = ErrorCode.UNAUTHORIZED


class Forbidden(ControlError):
    code = ErrorCode.FORBIDDEN


class ResourceNotFound(ControlError):
    code = ErrorCode.NOT_FOUND


class ImageNotFound(ResourceNotFound):
    code = ErrorCode.IMAGE_NOT_FOUND


class Conflict(ControlError):
    code = ErrorCode.NAME_CONFLICT


class HostInUse(ControlError):
    """A host cannot be forgotten while live sandboxes are on it."""

    code = ErrorCode.HOST_HAS_SANDBOXES


class TenantInUse(ControlError):
    """A tenant cannot be removed while any of its sandboxes is live; ``details["live_sandboxes"]``
    says how many are."""

    code = ErrorCode.TENANT_HAS_SANDBOXES


class PayloadTooLarge(ControlError):
    """The request's body is over its route's cap; refused before it is read in full."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class Gone(ControlError):
    code = ErrorCode.SANDBOX_ORPHANED


class TenantOverQuota(ControlError):
    code = ErrorCode.TENANT_OVER_QUOTA


class TenantRateLimited(ControlError):
    """A tenant's creates past its create rate: retry after the Retry-After its bucket computes."""

    code = ErrorCode.TENANT_RATE_LIMITED


class QueueFull(ControlError):
    """A tenant already has as many creates waiting for capacity as it may."""

    code = ErrorCode.QUEUE_FULL


class TooManyConcurrent(ControlError):
    """Too many of a sandbox's or a tenant's data-plane calls in flight; ``details["scope"]`` says
    which, with the limit and what is in flight. Retry once one of them ends."""

    code = ErrorCode.TOO_MANY_CONCURRENT


class BadGateway(ControlError):
    """The sandbox's host answered with an error that is not the caller's fault."""

    code = ErrorCode.AGENT_ERROR


class RegistryUnavailable(ControlError):
    """A recipe names a container registry's image, and that registry cannot be reached from here."""

    code = ErrorCode.REGISTRY_UNAVAILABLE

    def __init__(self, base: str, why: str) -> None:
        super().__init__(
            f"FROM {base[:200]!r} names no corral base and no template, and its registry cannot be "
            f"reached from this control plane: {why} (build from a base, a template, or "
            "`corral templates import` an image saved elsewhere)",
            details={"field": "recipe", "base": base[:200], "why": why},
        )


class SandboxNotReady(ControlError):
    """The template's ready check never passed within the bound: the create made no sandbox."""

    code = ErrorCode.SANDBOX_NOT_READY


class SandboxIsPaused(ControlError):
    """The sandbox is paused: nothing runs in it until it is resumed. The caller's state, not a fault."""

    code = ErrorCode.SANDBOX_PAUSED


class NotRunning(ControlError):
    """The sandbox exists but is not in a state that can run a command."""

    code = ErrorCode.SANDBOX_NOT_RUNNING
