"""Typed errors. Every error carries the server's stable ``code`` so callers branch on meaning, not on
message text; the class tells you what to do about it, the code tells you exactly what happened."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from corral.codes import RETRYABLE, ErrorCode

# Codes the server uses for "not now": the fleet (or its state of record) cannot take the create at
# this instant. The SDK retries these; everything else is a verdict about the request itself.
RETRYABLE_CODES = RETRYABLE
# Gateway failures in front of the server say nothing about the request either.
RETRYABLE_STATUSES = frozenset({502, 503, 504})


class CorralError(Exception):
    """Base of every error the SDK raises. ``code`` is stable and machine-readable."""

    code: str = ErrorCode.ERROR

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        retry_after_s: float | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.status = status
        self.retry_after_s = retry_after_s
        self.details: dict[str, Any] = dict(details or {})
        # The request id the server logged this request under (None when no response came back).
        self.request_id: str | None = None

    @property
    def retryable(self) -> bool:
        """True when the same request may succeed later unchanged (a tempo, not a verdict)."""
        return self.code in RETRYABLE_CODES or (
            self.code not in _PERMANENT_CODES and self.status in RETRYABLE_STATUSES
        )

    def __str__(self) -> str:
        where = f" (request {self.request_id})" if self.request_id else ""
        return f"{self.code}: {self.message}{where}"


class Unauthorized(CorralError):
    """401: the token is missing or unknown."""

    code = ErrorCode.UNAUTHORIZED


class Forbidden(CorralError):
    """403: the token is valid but may not do this (e.g. admin routes)."""

    code = ErrorCode.FORBIDDEN


class NotFound(CorralError):
    """404: no such sandbox for this tenant (another tenant's sandbox also answers 404)."""

    code = ErrorCode.NOT_FOUND


class NameConflict(CorralError):
    """409: a live sandbox already has this name."""

    code = ErrorCode.NAME_CONFLICT


class SandboxOrphaned(CorralError):
    """410: the sandbox's host died and it had no recreate policy; it answers again if the host returns."""

    code = ErrorCode.SANDBOX_ORPHANED


class SandboxPaused(CorralError):
    """409: the sandbox is paused; nothing runs in it (no exec) until it is resumed."""

    code = ErrorCode.SANDBOX_PAUSED


class Misdirected(CorralError):
    """421: a forwarded request reached a non-owner twice."""

    code = ErrorCode.MISDIRECTED


class HostBusy(CorralError):
    """409: a host cannot be forgotten while live sandboxes are on it."""

    code = ErrorCode.HOST_HAS_SANDBOXES


class TenantBusy(CorralError):
    """409: a tenant cannot be removed while any of its sandboxes is live (``details["live_sandboxes"]``
    says how many); delete them first."""

    code = ErrorCode.TENANT_HAS_SANDBOXES


class PayloadTooLarge(CorralError):
    """413: the request's body is over the route's cap."""

    code = ErrorCode.PAYLOAD_TOO_LARGE


class InvalidRequest(CorralError):
    """422: the request is wrong; ``field`` names the offending field when the server said which."""

    code = ErrorCode.INVALID_REQUEST

    @property
    def field(self) -> str | None:
        field = self.details.get("field")
        if isinstance(field, str):
            return field
        fields = self.details.get("fields")
        if isinstance(fields, list) and fields and isinstance(fields[0], str):
            return fields[0]
        return None


class OverQuota(CorralError):
    """429 ``tenant_over_quota``: the tenant's own limit. Permanent for this call: retrying will not help
    until the tenant frees something or its quota is raised."""

    code = ErrorCode.TENANT_OVER_QUOTA


class TooManyConcurrent(CorralError):
    """429 ``too_many_concurrent``: too many of this sandbox's (``scope == "sandbox"``) or this
    tenant's (``"tenant"``) data-plane calls are in flight; ``details`` has the ``limit`` and what is
    ``in_flight``. The same call succeeds once one of its own ends: wait ``retry_after_s`` and send it
    again if running it twice is safe. The SDK never resends an exec by itself: a command is not
    idempotent, and resending would only add to the pile this answer is about."""

    code = ErrorCode.TOO_MANY_CONCURRENT

    @property
    def scope(self) -> str | None:
        scope = self.details.get("scope")
        return scope if isinstance(scope, str) else None


class RateLimited(CorralError):
    """429 ``tenant_rate_limited``: the tenant asked for creates faster than its create rate. Not a
    verdict: the same create succeeds once the tenant's bucket refills (``retry_after_s`` says when),
    so the SDK retries it like a 503, with jittered backoff on top of that floor."""

    code = ErrorCode.TENANT_RATE_LIMITED


class Unreachable(CorralError):
    """The server could not be reached at all (connection refused, DNS, timeout, broken response)."""

    code = ErrorCode.UNREACHABLE

    @classmethod
    def from_transport(cls, exc: httpx.TransportError, url: str | None = None) -> Unreachable:
        where = f" {url}" if url else ""
        kind = type(exc).__name__
        return cls(f"cannot reach corral{where}: {kind}: {exc}".rstrip(": "))


class CapacityUnavailable(CorralError):
    """Transient. The fleet could not take the create before the deadline. Retry later.

    Do NOT write this to a status column: it is a statement about *right now*, with a half-life of
    seconds. Park the work as ``waiting_capacity`` and try again; never mark it ``error``/``failed``.

    ``code`` is the last refusal's code: ``no_capacity`` (come back in a moment), ``no_healthy_hosts``
    (the fleet is gone: an operator should look), ``store_unavailable``, ``tenant_rate_limited`` (the
    tenant's own pace), ``unreachable``, or a gateway failure. ``refusals`` counts every refusal seen, by code; ``first_refusal_at`` is on the client's
    clock, so ``clock() - first_refusal_at`` at the eventual success is "time from first refusal to
    success".
    """

    code = ErrorCode.NO_CAPACITY

    def __init__(
        self,
        message: str,
        *,
        code: str,
        attempts: int,
        elapsed_s: float,
        first_refusal_at: float,
        refusals: Mapping[str, int],
        status: int | None = None,
        retry_after_s: float | None = None,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message, code=code, status=status, retry_after_s=retry_after_s, details=details)
        self.attempts = attempts
        self.elapsed_s = elapsed_s
        self.first_refusal_at = first_refusal_at
        self.refusals = dict(refusals)

    @property
    def retryable(self) -> bool:
        return True

    @property
    def needs_operator(self) -> bool:
        """True when the last refusal said no host is healthy: that pages a human, capacity does not."""
        return self.code == ErrorCode.NO_HEALTHY_HOSTS

    @property
    def reached_server(self) -> bool:
        """False when every attempt failed before the server answered."""
        return any(code != Unreachable.code for code in self.refusals)


_BY_CODE: dict[str, type[CorralError]] = {
    cls.code: cls
    for cls in (
        Unauthorized,
        Forbidden,
        NotFound,
        NameConflict,
        SandboxOrphaned,
        SandboxPaused,
        Misdirected,
        HostBusy,
        TenantBusy,
        PayloadTooLarge,
        InvalidRequest,
        OverQuota,
        TooManyConcurrent,
        RateLimited,
    )
}
_PERMANENT_CODES = frozenset(_BY_CODE) - RETRYABLE

_BY_STATUS: dict[int, type[CorralError]] = {
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: NameConflict,
    410: SandboxOrphaned,
    413: PayloadTooLarge,
    421: Misdirected,
    422: InvalidRequest,
}


def _retry_after(response: httpx.Response, body_value: Any) -> float | None:
    """The body's ``retry_after_s`` wins (it may be fractional); else the header in delta-seconds form."""
    if isinstance(body_value, int | float) and not isinstance(body_value, bool) and body_value >= 0:
        return float(body_value)
    header = response.headers.get("Retry-After")
    if header is None:
        return None
    try:
        value = float(header.strip())
    except ValueError:
        return None  # an HTTP-date: rare from an API; the client's own backoff covers it
    return value if value >= 0 else None


def error_from_response(response: httpx.Response) -> CorralError:
    """Turn a non-2xx response into the typed error its code (or, failing that, its status) names."""
    status = response.status_code
    code: str | None = None
    message = response.reason_phrase or f"HTTP {status}"
    details: dict[str, Any] = {}
    body_retry_after: Any = None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        if isinstance(err.get("message"), str):
            message = err["message"]
        if isinstance(err.get("details"), dict):
            details = err["details"]
        body_retry_after = err.get("retry_after_s")
    elif isinstance(body, dict) and isinstance(body.get("detail"), str):
        message = body["detail"]

    retry_after = _retry_after(response, body_retry_after)
    if code is not None and code in _BY_CODE:
        cls = _BY_CODE[code]
    elif code is None and status in _BY_STATUS:
        cls = _BY_STATUS[status]
    else:
        # An unknown code keeps its own name on the base class, so a newer server's codes still reach
        # the caller verbatim; retryability then follows the status.
        cls = CorralError
    if code is None:
        code = _BY_STATUS[status].code if status in _BY_STATUS else _status_code_name(status)
    err = cls(message, code=code, status=status, retry_after_s=retry_after, details=details)
    rid = response.headers.get("x-request-id")
    if rid is None and response._request is not None:  # a response built by hand has no request
        rid = response._request.headers.get("x-request-id")
    err.request_id = rid[:128] if rid else None
    return err


def _status_code_name(status: int) -> str:
    return {
        429: "too_many_requests",
        500: "internal_error",
        502: "bad_gateway",
        503: "service_unavailable",
        504: "gateway_timeout",
    }.get(status, f"http_{status}")
