"""Every error leaves the API in DESIGN.md's one body shape, with a stable code; every 503 carries
Retry-After. No input produces a 500: validation, store and agent failures all have their own code."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from corral.agent.errors import AgentError
from corral.control.errors import ControlError, PayloadTooLarge
from corral.store import InvalidRecord, StoreError, StoreUnavailable
from corral.store import NotFound as StoreNotFound

log = logging.getLogger("corral.api")

_HTTP_CODES = {
    404: "not_found",
    405: "method_not_allowed",
    401: "unauthorized",
    403: "forbidden",
    PayloadTooLarge.status: PayloadTooLarge.code,
}


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    retry_after_s: float | None = None,
    details: dict[str, Any] | None = None,
) -> JSONResponse:
    headers = {}
    if status == 503 and retry_after_s is None:
        retry_after_s = 1
    if retry_after_s is not None:
        retry_after_s = max(1, math.ceil(retry_after_s))
        headers["Retry-After"] = str(int(retry_after_s))
    body = {
        "error": {"code": code, "message": message, "retry_after_s": retry_after_s, "details": details or {}}
    }
    return JSONResponse(body, status_code=status, headers=headers)


def _field(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header")]
    return ".".join(parts) or "body"


def invalid_request(errors: Sequence[Any]) -> JSONResponse:
    """422 for a request that failed validation: the first error's field leads, up to 20 listed."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    field = _field(tuple(first.get("loc", ())))
    return error_response(
        422,
        "invalid_request",
        f"{field}: {first.get('msg', 'invalid')}",
        details={
            "field": field,
            "errors": [
                {"field": _field(tuple(e.get("loc", ()))), "message": e.get("msg")} for e in errors[:20]
            ],
        },
    )


def response_for(exc: Exception, store_unavailable_retry: Any) -> JSONResponse:
    """The one answer each kind of failure gets, whichever route raised it."""
    if isinstance(exc, RequestValidationError):
        return invalid_request(exc.errors())
    if isinstance(exc, ControlError):
        return error_response(
            exc.status, exc.code, exc.message, retry_after_s=exc.retry_after_s, details=exc.details
        )
    if isinstance(exc, StoreUnavailable):
        err = store_unavailable_retry(exc)
        return error_response(err.status, err.code, err.message, retry_after_s=err.retry_after_s)
    if isinstance(exc, InvalidRecord):
        return error_response(
            422, "invalid_request", str(exc), details={"field": "cursor" if "cursor" in str(exc) else "body"}
        )
    if isinstance(exc, StoreError):
        return error_response(404 if isinstance(exc, StoreNotFound) else 409, exc.code, str(exc))
    if isinstance(exc, AgentError):
        status = 503 if exc.retryable else 502
        return error_response(
            status, exc.code, exc.message, retry_after_s=exc.retry_after_s if status == 503 else None
        )
    if isinstance(exc, StarletteHTTPException):
        return error_response(
            exc.status_code, _HTTP_CODES.get(exc.status_code, "http_error"), str(exc.detail)
        )
    log.exception("unexpected error", exc_info=exc)
    return error_response(500, "internal", "internal error")


def install(app: FastAPI, store_unavailable_retry: Any) -> None:
    async def handle(_: Request, exc: Exception) -> JSONResponse:
        return response_for(exc, store_unavailable_retry)

    for kind in (
        RequestValidationError,
        ControlError,
        StoreUnavailable,
        InvalidRecord,
        StoreError,
        AgentError,
        StarletteHTTPException,
        Exception,
    ):
        app.add_exception_handler(kind, handle)
