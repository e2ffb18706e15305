"""The data plane on the control plane's port: a call carrying ``E2b-Sandbox-Id`` is authorized here
(the sandbox's access token, or its tenant's key) and handed to the agent of the host that runs the
sandbox: in this process when the agent lives here, otherwise over HTTP, streamed both ways as it
comes. A call that already went through a replica carries ``Corral-Forwarded``; one arriving with it
would be forwarded a second time, which is refused (421 ``misdirected``) so a routing loop cannot form.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from corral.agent.client import HttpAgentClient, LocalAgentClient
from corral.agent.envd import CALLER_AUTH_HEADER, ENVD_PREFIX, SANDBOX_HEADER, Envd
from corral.agent.errors import AgentError, AgentSandboxNotFound
from corral.agent.portrelay import relay_response, request_body
from corral.agent.protocol import HOP_HEADER
from corral.api.e2b.access import AccessKey, valid
from corral.api.e2b.control import DEFAULT_TIMEOUT_S
from corral.codes import ErrorCode, retry_after_header
from corral.control import lifecycle
from corral.control.errors import BadGateway, ControlError, ResourceNotFound, TooManyConcurrent
from corral.control.plane import ControlPlane
from corral.core.lifecycle import PAUSED_MEMORY, Lifecycle
from corral.store import Role, SandboxRecord, SandboxState, StoreUnavailable

_HOP_BY_HOP = {
    b"connection",
    b"keep-alive",
    b"transfer-encoding",
    b"te",
    b"upgrade",
    b"host",
    b"content-length",
}


def starts_command(path: str) -> bool:
    """The calls that run a command in the sandbox (a process, or the helper of a file operation):
    those the tenant's bound counts, for as long as the call lasts."""
    return path in ("/files", "/process.Process/Start") or path.startswith("/filesystem.")


def is_data_plane(scope: Scope) -> bool:
    if scope["type"] != "http":
        return False
    path: str = scope["path"]
    if not (path in ("/health", "/files") or path.startswith(("/process.", "/filesystem."))):
        return False
    return any(k == SANDBOX_HEADER.encode() for k, _ in scope["headers"])


async def _reply(
    send: Send, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    data = json.dumps(body).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": data})


class DataPlane:
    def __init__(self, plane: ControlPlane, secret: AccessKey) -> None:
        self.plane = plane
        self.secret = secret
        self._envds: dict[int, Envd] = {}

    def envd(self, client: LocalAgentClient) -> Envd:
        found = self._envds.get(id(client.agent))
        if found is None or found.agent is not client.agent:
            found = self._envds[id(client.agent)] = Envd(client.agent)
        return found

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if HOP_HEADER in headers:
            await _reply(
                send,
                421,
                {
                    "code": 421,
                    "message": "this call was already forwarded once",
                    "error_code": ErrorCode.MISDIRECTED,
                },
            )
            return
        sandbox_id = headers.get(SANDBOX_HEADER, "")
        try:
            tenant_id, host_id, address = await self._locate(sandbox_id, headers)
        except ControlError as exc:
            retry = {"Retry-After": str(int(exc.retry_after_s or 1))} if exc.status == 503 else None
            status = 502 if exc.status == 404 else exc.status  # what E2B's proxy answers for a gone sandbox
            await _reply(
                send, status, {"code": status, "message": exc.message, "error_code": exc.code}, retry
            )
            return
        except StoreUnavailable:
            await _reply(send, 503, {"code": 503, "message": "store unavailable"}, {"Retry-After": "1"})
            return
        try:
            # Only the slot's taking raises this: the relay answers its own errors.
            with self.plane.sandboxes.tenant_slot(tenant_id if starts_command(scope["path"]) else None):
                await self._relay(host_id, address, scope, receive, send)
        except TooManyConcurrent as exc:
            body = {"code": 429, "message": exc.message, "error_code": exc.code, "details": exc.details}
            await _reply(send, 429, body, {"Retry-After": retry_after_header(exc.retry_after_s)})

    async def _relay(self, host_id: str, address: str, scope: Scope, receive: Receive, send: Send) -> None:
        client = self.plane.agents.client(host_id, address)
        if isinstance(client, LocalAgentClient):
            await self.envd(client)(scope, receive, send)
        elif isinstance(client, HttpAgentClient):
            await forward(client, scope, receive, send)
        else:
            await _reply(send, 502, {"code": 502, "message": f"host {host_id} has no data plane"})

    async def _locate(self, sandbox_id: str, headers: dict[str, str]) -> tuple[str, str, str]:
        """The sandbox's tenant and host, once the caller has shown it may reach it. Every refusal looks the same
        as a sandbox that does not exist, so a caller learns nothing about other tenants' sandboxes.
        While the store is unreachable, the location this replica remembers serves (running sandboxes
        keep serving)."""
        missing = ResourceNotFound(f"sandbox {sandbox_id} was not found")
        if not sandbox_id:
            raise missing
        try:
            record = await self.plane.store.get_sandbox(sandbox_id)
        except StoreUnavailable:
            loc = self.plane.sandboxes.locations.get(sandbox_id)
            if loc is None or not await self._allowed(sandbox_id, loc.tenant_id, headers):
                raise
            return loc.tenant_id, loc.host_id, loc.address
        if record is None or not await self._allowed(sandbox_id, record.tenant_id, headers):
            raise missing
        if record.state is not SandboxState.RUNNING or record.host_id is None:
            raise missing
        address = await self.plane.sandboxes._address(record.host_id)
        if record.paused is not None:
            await self._wake(record, address)
        return record.tenant_id, record.host_id, address

    async def _wake(self, record: SandboxRecord, address: str) -> None:
        """A paused sandbox created with auto-resume is resumed by this call (its timeout the one it
        was created with, from now), then served; any other stays paused and is answered as E2B's
        proxy answers a sandbox it does not run."""
        life = Lifecycle.parse(record.lifecycle)
        if not (life.auto_resume and record.paused == PAUSED_MEMORY):
            raise ResourceNotFound(
                f"sandbox {record.id} is paused and was not found running: resume it with connect"
            )
        assert record.host_id is not None
        client = self.plane.agents.client(record.host_id, address)
        timeout = life.timeout_s or DEFAULT_TIMEOUT_S
        try:
            await lifecycle.resume(
                self.plane.store, client, record, expires_at=self.plane.clock.now() + timeout
            )
        except AgentSandboxNotFound:
            raise ResourceNotFound(f"sandbox {record.id} was not found") from None
        except AgentError as exc:
            raise BadGateway(
                f"sandbox {record.id} could not be resumed: {exc.message}", code=exc.code
            ) from None

    async def _allowed(self, sandbox_id: str, tenant_id: str, headers: dict[str, str]) -> bool:
        token = headers.get("x-access-token")
        if token is not None and valid(await self.secret.get(), sandbox_id, token):
            return True
        key = headers.get("x-api-key")
        if not key:
            return False
        try:
            p = await self.plane.authenticate(key)
        except ControlError:
            return False
        return p.role is Role.ADMIN or (p.role is Role.TENANT and p.tenant_id == tenant_id)


async def forward(client: HttpAgentClient, scope: Scope, receive: Receive, send: Send) -> None:
    """Relay one call to an agent's data plane, streaming the request and the answer as they come."""

    headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
    headers.append((HOP_HEADER.encode(), b"1"))
    path = ENVD_PREFIX + scope["path"]
    query = scope.get("query_string", b"").decode("latin-1")
    http = client.http
    request = http.build_request(
        scope["method"],
        path + (f"?{query}" if query else ""),
        headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
        content=request_body(receive),
        timeout=httpx.Timeout(10.0, read=None, write=None),
    )
    # The host's key proves this replica to the agent; the caller's own credentials (which name the
    # sandbox user) travel beside it.
    if "authorization" in request.headers:
        request.headers[CALLER_AUTH_HEADER] = request.headers["authorization"]
    request.headers.update(await client.auth_headers())
    try:
        response = await http.send(request, stream=True)
    except httpx.HTTPError as exc:
        await _reply(send, 502, {"code": 502, "message": f"the sandbox's host is unreachable: {exc!r}"})
        return
    await relay_response(response, send, _HOP_BY_HOP)
