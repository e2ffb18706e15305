"""E2B API calls corral does not serve, each answered in E2B's error shape as what it is: 501
``unsupported_operation`` naming the feature, after the caller's key is checked. Left to the default
404, the SDK would read them as "sandbox not found" of a sandbox that runs (``fork``,
``create_snapshot``). docs/e2b.md lists each, and why."""

from __future__ import annotations

from fastapi import APIRouter, Request

from corral.api.e2b.control import caller
from corral.control.errors import UnsupportedOperation

router = APIRouter()

LOGS = "a sandbox's own log: each command's output is kept (commands.connect reads it)"

# (methods, path, what is not served and why), in E2B's own paths (its generated client, SDK 2.63).
UNSERVED: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("POST",), "/sandboxes/{sandbox_id}/fork", "forking a sandbox: corral has no memory snapshots"),
    (("POST",), "/sandboxes/{sandbox_id}/snapshots", "snapshots: corral has no memory snapshots"),
    (("GET",), "/snapshots", "snapshots: corral has no memory snapshots"),
    (("POST",), "/sandboxes/{sandbox_id}/refreshes", "refreshes: use set_timeout"),
    (("GET",), "/sandboxes/{sandbox_id}/logs", LOGS),
    (("GET",), "/v2/sandboxes/{sandbox_id}/logs", LOGS),
    (("GET",), "/sandboxes/metrics", "metrics of many sandboxes at once: ask each sandbox's"),
    (("GET", "POST"), "/volumes", "volumes"),
    (("GET", "DELETE"), "/volumes/{volume_id}", "volumes"),
    (("GET", "PUT", "PATCH", "DELETE"), "/volumecontent/{volume_id}/{what}", "volumes"),
    (("GET", "POST"), "/secrets", "secrets"),
    (("GET", "PATCH", "DELETE"), "/secrets/{secret_id}", "secrets"),
)
# Outside E2B's sandbox and template paths: the prefixes the dispatch sends here too.
PREFIXES = ("/snapshots", "/volumes", "/volumecontent/", "/secrets")


def _refusal(what: str):  # type: ignore[no-untyped-def]  # a FastAPI endpoint, its request injected
    async def refuse(request: Request) -> None:
        await caller(request)  # an unknown key is refused as everywhere else (401), before this
        raise UnsupportedOperation(f"not supported by corral: {what}")

    return refuse


for methods, path, what in UNSERVED:
    router.add_api_route(path, _refusal(what), methods=list(methods), include_in_schema=False)
