"""Errors as Kubernetes ``Status`` objects, which kubectl prints well: corral's one answer per kind
of failure (:func:`corral.api.errors.response_for`), reshaped, its stable code kept as the cause."""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse

from corral.api.errors import response_for
from corral.api.jsonresponse import OrjsonResponse
from corral.control.plane import ControlPlane

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "AlreadyExists",
    410: "Expired",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    502: "InternalError",
    503: "ServiceUnavailable",
}


class ObjectResponse(OrjsonResponse):
    """An object or list, encoded by orjson: a Table of 10,000 rows is most of a list's time in the
    standard library's encoder."""


def status_body(code: int, message: str, cause: str, **details: Any) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": REASONS.get(code, "BadRequest" if code < 500 else "InternalError"),
        "details": {**details, "causes": [{"reason": cause, "message": message}]},
        "code": code,
    }


def status_response(code: int, message: str, cause: str, **details: Any) -> JSONResponse:
    return JSONResponse(status_body(code, message, cause, **details), status_code=code)


def kube_error(plane: ControlPlane, exc: Exception) -> JSONResponse:
    plain = response_for(exc, plane.store_unavailable)
    err = json.loads(bytes(plain.body))["error"]
    out = status_response(plain.status_code, err["message"], err["code"])
    if "retry-after" in plain.headers:
        out.headers["Retry-After"] = plain.headers["retry-after"]
        out_body = json.loads(bytes(out.body))
        out_body["details"]["retryAfterSeconds"] = int(plain.headers["retry-after"])
        out = JSONResponse(
            out_body, status_code=plain.status_code, headers={"Retry-After": plain.headers["retry-after"]}
        )
    return out
