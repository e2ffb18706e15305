"""The HTTP contract, shared by the sync and async clients: paths, headers, bodies, and how a response
becomes a value or a typed error. Nothing here performs I/O."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx

from corral.client.errors import CorralError, InvalidRequest, Unreachable, error_from_response
from corral.codes import ErrorCode
from corral.exec_result import (
    ANSWER_MARGIN_S,
    DEFAULT_EXEC_TIMEOUT_S,
    ExecOutput,
    ExecResult,
    ExecStreamError,
    decode_event,
)

DEFAULT_URL = "http://127.0.0.1:8700"
URL_ENV = "CORRAL_URL"
TOKEN_ENV = "CORRAL_TOKEN"
DEFAULT_TIMEOUT_S = 30.0
IDEMPOTENCY_HEADER = "Idempotency-Key"
REQUEST_ID_HEADER = "X-Request-Id"


def resolve_url(url: str | None) -> str:
    """Explicit argument, then ``$CORRAL_URL``, then the local default."""
    chosen = url or os.environ.get(URL_ENV) or DEFAULT_URL
    if not chosen.startswith(("http://", "https://")):
        raise InvalidRequest(
            f"url must start with http:// or https://, got {chosen!r}", details={"field": "url"}
        )
    return chosen.rstrip("/")


def resolve_token(token: str | None) -> str | None:
    return token if token is not None else os.environ.get(TOKEN_ENV)


# A kept-alive connection is given up a second before the server closes an idle one (its default
# keep-alive is 5 s, ``corral.core.listen``): with both at 5 s, a request sent as the server closed
# the connection met "Server disconnected without sending a response".
KEEPALIVE_EXPIRY_S = 4.0
LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=KEEPALIVE_EXPIRY_S)


def headers(token: str | None) -> dict[str, str]:
    out = {"Accept": "application/json", "User-Agent": "corral-sdk"}
    if token:
        out["Authorization"] = f"Bearer {token}"
    return out


def with_request_id(extra: Mapping[str, str] | None) -> dict[str, str]:
    """Per-request headers: the caller's, plus a fresh request id the server logs and echoes back, so
    an error can be found in the server's logs."""
    out = dict(extra or {})
    out.setdefault(REQUEST_ID_HEADER, uuid.uuid4().hex)
    return out


def sandbox_path(sandbox_id: str) -> str:
    if not sandbox_id or "/" in sandbox_id:
        raise InvalidRequest(f"invalid sandbox id {sandbox_id!r}", details={"field": "id"})
    return f"/v1/sandboxes/{sandbox_id}"


def commands_path(sandbox_id: str, pid: int | None = None) -> str:
    """A sandbox's background commands, or one of them by its pid."""
    path = sandbox_path(sandbox_id) + "/commands"
    return path if pid is None else f"{path}/{int(pid)}"


# The longest one call waits for a background command to end (the server's bound); a longer wait
# asks again.
COMMAND_WAIT_S = 60.0


def host_path(host_id: str) -> str:
    if not host_id or "/" in host_id:
        raise InvalidRequest(f"invalid host id {host_id!r}", details={"field": "host_id"})
    return f"/v1/hosts/{host_id}"


# How much longer than the server may hold a waiting create the client waits for its answer.
WAIT_MARGIN_S = 30.0


def create_body(template: str, **options: Any) -> dict[str, Any]:
    """The create spec: the template and the options given. An absent option (None) is omitted so the
    server's default applies; a mapping is copied. The options are typed where the SDK declares them
    (``AsyncSandboxes.create``), and named there as the API names them."""
    body: dict[str, Any] = {"template": template}
    body.update({k: dict(v) if isinstance(v, Mapping) else v for k, v in options.items() if v is not None})
    return body


def exec_wait_s(timeout_s: float | None) -> float:
    """How long a client waits for an exec's answer: the command's own timeout, and the margins of
    the two hops behind the API (the replica's wait on the agent, the agent's on the command)."""
    return (DEFAULT_EXEC_TIMEOUT_S if timeout_s is None else timeout_s) + 2 * ANSWER_MARGIN_S


OutputCallback = Callable[[str], object]


class ExecOutputs:
    """A streamed command's output, handed to its callbacks as it comes and kept for its result."""

    def __init__(self, on_stdout: OutputCallback | None, on_stderr: OutputCallback | None) -> None:
        self._callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        self._kept: dict[str, list[str]] = {"stdout": [], "stderr": []}
        self._result: ExecResult | None = None

    def take(self, event: ExecOutput | ExecResult) -> None:
        if isinstance(event, ExecResult):
            self._result = event
            return
        self._kept[event.stream].append(event.text)
        callback = self._callbacks[event.stream]
        if callback is not None:
            callback(event.text)

    def result(self) -> ExecResult:
        assert self._result is not None  # the stream raises when it ends without one
        kept = {name: "".join(parts) for name, parts in self._kept.items()}
        return self._result.model_copy(update=kept)


def exec_event(line: str) -> ExecOutput | ExecResult | None:
    """One line of a streamed exec's answer; an error line is raised as the error it names."""
    if not line:
        return None
    try:
        event = decode_event(line)
    except ValueError as exc:
        raise CorralError(str(exc), code=ErrorCode.BAD_RESPONSE) from exc
    if isinstance(event, ExecStreamError):
        raise CorralError(event.message, code=event.code)
    return event


def answer_cut_short(url: str) -> CorralError:
    return Unreachable(f"the connection to corral at {url} ended before the command's result")


def exec_body(
    command: str | Sequence[str],
    *,
    timeout_s: float | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
    if timeout_s is not None:
        body["timeout_s"] = timeout_s
    if env is not None:
        body["env"] = dict(env)
    if cwd is not None:
        body["cwd"] = cwd
    return body


def list_params(
    *, state: str | None, host_id: str | None, limit: int | None, cursor: str | None
) -> dict[str, str | int]:
    params: dict[str, str | int] = {}
    if state is not None:
        params["state"] = state
    if host_id is not None:
        params["host_id"] = host_id
    if limit is not None:
        params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    return params


def body_of(response: httpx.Response) -> Any:
    """The JSON body of a successful response, or the typed error a failed one names."""
    if not response.is_success:
        raise error_from_response(response)
    if response.status_code == 204 or not response.content:
        return None
    try:
        return response.json()
    except ValueError as exc:
        raise CorralError(
            f"server answered {response.status_code} with a body that is not JSON",
            code=ErrorCode.BAD_RESPONSE,
        ) from exc


TOKENS_PATH = "/v1/tokens"


def token_path(token_id: str) -> str:
    return f"{TOKENS_PATH}/{quote(token_id, safe='')}"


TENANTS_PATH = "/v1/tenants"


def tenant_path(tenant: str) -> str:
    if not tenant or "/" in tenant:
        raise InvalidRequest(f"invalid tenant name {tenant!r}", details={"field": "name"})
    return f"{TENANTS_PATH}/{quote(tenant, safe='')}"


def tenant_tokens_path(tenant: str) -> str:
    return tenant_path(tenant) + "/tokens"


def tenant_body(
    name: str, max_sandboxes: int | None, max_memory_mb: int | None, max_cpus: float | None
) -> dict[str, Any]:
    limits = {"max_sandboxes": max_sandboxes, "max_memory_mb": max_memory_mb, "max_cpus": max_cpus}
    return {"name": name, **{k: v for k, v in limits.items() if v is not None}}
