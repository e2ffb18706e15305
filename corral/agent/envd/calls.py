"""What every call of the data plane shares: the sandbox it names (and the user it speaks as: its own, or root in one of an image),
its message read within a bound, its unary errors, and the commands it spawns in the sandbox, each
holding one of the sandbox's command slots (the agent's bound, shared with exec) until it exits."""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextvars
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from corral.agent.agent import Agent
from corral.agent.envd.connect import JsonAnswer, RpcBusy, RpcError, parse_json
from corral.agent.errors import AgentBusy, AgentError
from corral.agent.protocol import CALLER_AUTH_HEADER
from corral.runtime.base import (
    InvalidSandbox,
    RuntimeFailure,
    SandboxNotFound,
    SandboxPaused,
    Unsupported,
)
from corral.runtime.bwrap import ROOT_USER, SANDBOX_USER
from corral.runtime.stream import PtySize, Spawned

SANDBOX_HEADER = "e2b-sandbox-id"
MAX_MESSAGE_BYTES = 1024 * 1024
CHUNK = 32 * 1024  # what one read of a command's output takes
QUEUE = 8  # chunks in flight between a reader and a writer
# The user the call being served chose (None: the sandbox's own), set by Calls.sandbox for the
# commands that call spawns: each request is served in a context of its own.
_USER: contextvars.ContextVar[str | None] = contextvars.ContextVar("envd_user", default=None)


class Calls:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self._slots: set[asyncio.Task[None]] = set()  # each hands a command's slot back as it exits

    def sandbox(self, request: Request) -> str:
        """The sandbox the request names, if it is on this host and the caller speaks as its one user."""
        sandbox_id = request.headers.get(SANDBOX_HEADER, "")
        try:
            self.agent.get(sandbox_id)
        except AgentError:
            raise RpcError("not_found", f"sandbox {sandbox_id} was not found") from None
        user = _basic_user(
            request.headers.get(CALLER_AUTH_HEADER) or request.headers.get("authorization", "")
        )
        spec = self.agent.spec_of(sandbox_id)
        chosen: str | None = None
        for name in (user, request.query_params.get("username")):
            if not name or name in (SANDBOX_USER, spec.user):
                continue
            if name != ROOT_USER:
                raise RpcError(
                    "permission_denied",
                    f"a corral sandbox runs commands as {SANDBOX_USER!r} (or root, in a sandbox of an "
                    f"image template); not {name!r}",
                )
            if spec.image is None:
                raise RpcError(
                    "permission_denied",
                    f"user 'root' runs only in a sandbox of an image template (root inside, an "
                    f"unprivileged uid on the host); sandbox {sandbox_id} runs on the host's own "
                    f"system, as its one user {SANDBOX_USER!r}",
                )
            chosen = ROOT_USER
        _USER.set(chosen)
        return sandbox_id

    async def message(self, request: Request, limit: int = MAX_MESSAGE_BYTES) -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RpcError("resource_exhausted", f"the request is larger than {limit} bytes")
        return bytes(body)

    def rpc(
        self, handler: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                sandbox_id = self.sandbox(request)
                result = await handler(sandbox_id, parse_json(await self.message(request)))
            except RpcError as exc:
                return unary_error(exc)
            except ClientDisconnect:
                return Response(status_code=499)
            return JsonAnswer(result)

        return endpoint

    async def spawn(
        self,
        sandbox_id: str,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        pty: PtySize | None = None,
    ) -> Spawned:
        """Every command of this data plane starts here, holding one of the sandbox's command slots
        (the agent's bound, shared with exec) until it exits, as the user the call chose
        (:meth:`sandbox`)."""
        try:
            self.agent.enter(sandbox_id)
        except AgentBusy as exc:
            raise RpcBusy(exc.message, exc.retry_after_s) from None
        try:
            spawned = await self.agent.runtime.spawn(
                sandbox_id, command, env=env, cwd=cwd, stdin=stdin, user=_USER.get(), pty=pty
            )
        except BaseException as exc:
            self.agent.leave(sandbox_id)
            if isinstance(exc, SandboxNotFound):
                raise RpcError("not_found", f"sandbox {sandbox_id} was not found") from None
            if isinstance(exc, SandboxPaused):
                raise RpcError("failed_precondition", str(exc)) from None
            if isinstance(exc, Unsupported):
                raise RpcError("unimplemented", str(exc)) from None
            if isinstance(exc, InvalidSandbox):
                raise RpcError("invalid_argument", f"{exc.field}: {exc}") from None
            if isinstance(exc, RuntimeFailure):
                raise RpcError("unavailable", str(exc)) from None
            raise
        task = asyncio.get_running_loop().create_task(self._leave_at_exit(sandbox_id, spawned))
        self._slots.add(task)
        task.add_done_callback(self._slots.discard)
        return spawned

    async def _leave_at_exit(self, sandbox_id: str, spawned: Spawned) -> None:
        try:
            await spawned.wait()
        finally:
            self.agent.leave(sandbox_id)


def _basic_user(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode().partition(":")[0] or None
    except (binascii.Error, UnicodeDecodeError):
        return None


def unary_error(exc: RpcError) -> Response:
    headers = exc.headers() if isinstance(exc, RpcBusy) else None
    return JsonAnswer(exc.body(), status_code=exc.status, headers=headers)
