"""Every error leaves the API in one body shape, ``{"error": {"code", "message", "retry_after_s",
"details"}}``, with a stable code a client can branch on; every 503 carries Retry-After. No input
produces a 500: validation, store and agent failures all have their own code. The OpenAPI description
declares that shape for every error response."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from pydantic import BaseModel, TypeAdapter
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from corral.agent.errors import AgentError
from corral.codes import ErrorCode, status_of
from corral.control.errors import ControlError
from corral.store import InvalidRecord, StoreError, StoreUnavailable

log = logging.getLogger("corral.api")

_HTTP_CODES = {
    c.status: c
    for c in (
        ErrorCode.NOT_FOUND,
        ErrorCode.METHOD_NOT_ALLOWED,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN,
        ErrorCode.PAYLOAD_TOO_LARGE,
    )
}


class ErrorDetail(BaseModel):
    code: str
    message: str
    retry_after_s: int | None
    details: dict[str, Any]


class ErrorBody(BaseModel):
    error: ErrorDetail


def document_errors(app: FastAPI) -> None:
    """Describe every error response as ``ErrorBody`` in the app's OpenAPI, in place of FastAPI's own
    validation-error shape, which this API never sends."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            body = TypeAdapter(ErrorBody).json_schema(ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(body.pop("$defs", {}))
            components["ErrorBody"] = body
            for name in ("HTTPValidationError", "ValidationError"):
                components.pop(name, None)
            error = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    responses = operation.setdefault("responses", {})
                    if "422" in responses:
                        responses["422"] = {"description": "Invalid request", "content": error}
                    responses["default"] = {"description": "An error", "content": error}
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


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


def _words(error: Any) -> str:
    """A validation error in a user's words rather than the validator's ("at most 256 entries, got
    5000", not "Dictionary should have at most 256 items after validation")."""
    kind, ctx, msg = error.get("type"), error.get("ctx") or {}, str(error.get("msg", "invalid"))
    if kind == "too_long" and "max_length" in ctx:
        got = f", got {ctx['actual_length']}" if ctx.get("actual_length") is not None else ""
        return f"at most {ctx['max_length']} entries{got}"
    if kind == "string_too_long" and "max_length" in ctx:
        return f"at most {ctx['max_length']} characters"
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "not a field of this request"
    return msg


def invalid_request(errors: Sequence[Any]) -> JSONResponse:
    """422 for a request that failed validation: the first error's field leads, up to 20 listed."""
    first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
    field = _field(tuple(first.get("loc", ())))
    return error_response(
        422,
        ErrorCode.INVALID_REQUEST,
        f"{field}: {_words(first)}",
        details={
            "field": field,
            "errors": [{"field": _field(tuple(e.get("loc", ()))), "message": _words(e)} for e in errors[:20]],
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
            422,
            ErrorCode.INVALID_REQUEST,
            str(exc),
            details={"field": "cursor" if "cursor" in str(exc) else "body"},
        )
    if isinstance(exc, StoreError):
        return error_response(status_of(exc.code, 409), exc.code, str(exc))
    if isinstance(exc, AgentError):
        status = exc.status if exc.status == 429 else 503 if exc.retryable else 502
        return error_response(
            status,
            exc.code,
            exc.message,
            retry_after_s=exc.retry_after_s if status in (429, 503) else None,
            details=exc.details if status == 429 else None,
        )
    if isinstance(exc, StarletteHTTPException):
        return error_response(
            exc.status_code, _HTTP_CODES.get(exc.status_code, ErrorCode.HTTP_ERROR), str(exc.detail)
        )
    if isinstance(exc, ClientDisconnect):
        # The client went (or its body stalled and the listener closed it): nobody reads this answer,
        # and a traceback per hostile client would only flood the log.
        return error_response(400, ErrorCode.HTTP_ERROR, "the client disconnected during its request")
    log.exception("unexpected error", exc_info=exc)
    return error_response(500, ErrorCode.INTERNAL, "internal error")


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
        ClientDisconnect,  # answered where it is raised, not re-raised to the server as a crash
        Exception,
    ):
        app.add_exception_handler(kind, handle)
