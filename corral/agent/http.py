"""The agent's HTTP API: a thin FastAPI wrapper over :class:`~corral.agent.agent.Agent`.

Every route but ``/healthz`` needs ``Authorization: Bearer <host key>``: the key enrolment gave this
host, which only the control plane holds (compared in constant time). Every error has the
one body shape of corral's APIs, ``{"error": {"code", "message", "retry_after_s", "details"}}``; retryable refusals are
503 with a ``Retry-After`` header; bad input is 422 naming the field.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable, Mapping
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.agent.agent import Agent
from corral.agent.envd import ENVD_PREFIX, Envd
from corral.agent.errors import AgentError, AgentInvalid, AgentUnauthorized
from corral.agent.execstream import ExecResponse, unless_caller_goes
from corral.agent.metrics import AgentCollector
from corral.agent.portrelay import refuse
from corral.agent.ports import AgentPorts, PortPlan
from corral.agent.portsplice import PortSplicer
from corral.agent.protocol import (
    EPOCH_HEADER,
    MAX_COMMAND_WAIT_S,
    Capacity,
    ClaimWarm,
    EgressPolicyBody,
    ExecRequest,
    SandboxInfo,
    SandboxSamples,
    StartSandbox,
)
from corral.codes import ErrorCode, retry_after_header
from corral.exec_result import ExecResult
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput

# The epoch the caller routes to; absent: any (a call from this host's own operator).
EpochHeader = Annotated[Annotated[int, Field(ge=0, lt=2**63)] | None, Header(alias=EPOCH_HEADER)]
Pid = Annotated[int, Field(ge=1, lt=2**63)]
WaitS = Annotated[float, Query(ge=0, le=MAX_COMMAND_WAIT_S)]

log = logging.getLogger("corral.agent.http")


def error_response(err: AgentError) -> JSONResponse:
    headers = {}
    if err.status in (429, 503) and err.retry_after_s is not None:
        headers["Retry-After"] = retry_after_header(err.retry_after_s)
    if err.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(err.body(), status_code=err.status, headers=headers)


def _field(error: Mapping[str, Any]) -> str:
    # ("body", "memory_mb") -> "memory_mb"; ("body", "command", 0) -> "command.0"
    if error.get("type") == "json_invalid":
        return "body"  # its loc holds a character offset, not a field
    parts = [str(p) for p in error.get("loc", ()) if p not in ("body", "path", "query", "header")]
    return ".".join(parts) or "body"


def create_app(agent: Agent, token: str) -> FastAPI:
    """The agent's ASGI app. Tests plug it into ``httpx.ASGITransport``; the CLI serves it with uvicorn.
    ``token``: the host key callers must present."""
    if not token:
        raise ValueError("an agent needs a host key: its API must never be open")
    expected = token.encode()

    def key_presented(header: str) -> bool:
        scheme, _, presented = header.partition(" ")
        # Constant-time, so the answer's timing says nothing about how much of a guess was right.
        return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), expected)

    def authorized(request: Request) -> bool:
        return key_presented(request.headers.get("authorization", ""))

    def authenticate(request: Request) -> None:
        if not authorized(request):
            raise AgentUnauthorized(message="missing or invalid bearer token")

    app = FastAPI(title=f"corral agent {agent.id}", openapi_url=None, docs_url=None, redoc_url=None)
    app.state.agent = agent
    # Before the parser (the listener's front): port requests a replica forwarded, spliced as bytes.
    app.state.port_splicer = PortSplicer(PortPlan(agent, key_presented))
    api = APIRouter(dependencies=[Depends(authenticate)])

    @app.exception_handler(AgentError)
    async def _agent_error(request: Request, exc: AgentError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        if not authorized(request):  # the body is parsed before dependencies run: say 401 first
            return error_response(AgentUnauthorized(message="missing or invalid bearer token"))
        errors = exc.errors()
        first = errors[0] if errors else {"loc": ("body",), "msg": "invalid request"}
        field = _field(first)
        fields = sorted({_field(e) for e in errors})
        return error_response(
            AgentInvalid(
                ErrorCode.INVALID_REQUEST,
                f"{field}: {first.get('msg', 'invalid')}",
                details={"field": field, "fields": fields},
            )
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: ErrorCode.NOT_FOUND, 405: ErrorCode.METHOD_NOT_ALLOWED}.get(
            exc.status_code, ErrorCode.HTTP_ERROR
        )
        err = AgentError(code, str(exc.detail))
        err.status = exc.status_code
        return error_response(err)

    @app.exception_handler(ClientDisconnect)
    async def _gone(request: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=400)  # nobody reads it; nothing to log

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("agent %s: unexpected error on %s %s", agent.id, request.method, request.url.path)
        return error_response(AgentError(ErrorCode.INTERNAL, "internal error"))

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "agent_id": agent.id}

    @api.post("/v1/sandboxes", status_code=201)
    async def start(body: StartSandbox) -> SandboxInfo:
        return await agent.start(body)

    @api.post("/v1/warm/{template}/claim")
    async def claim_warm(template: str, body: ClaimWarm) -> SandboxInfo:
        return agent.claim(template, body)

    @api.get("/v1/sandboxes")
    async def list_sandboxes() -> list[SandboxInfo]:
        return agent.list()

    @api.get("/v1/sandboxes/{sandbox_id}")
    async def get_sandbox(sandbox_id: str) -> SandboxInfo:
        return await agent.read(sandbox_id)

    @api.delete("/v1/sandboxes/{sandbox_id}", status_code=204)
    async def stop(sandbox_id: str, epoch: EpochHeader = None) -> Response:
        await agent.stop(sandbox_id, epoch)
        return Response(status_code=204)

    @api.post("/v1/sandboxes/{sandbox_id}/exec")
    async def exec_(
        sandbox_id: str, body: ExecRequest, request: Request, epoch: EpochHeader = None
    ) -> ExecResult:
        return await unless_caller_goes(request, agent.exec(sandbox_id, body, epoch))

    @api.post("/v1/sandboxes/{sandbox_id}/exec/stream")
    async def exec_stream(sandbox_id: str, body: ExecRequest, epoch: EpochHeader = None) -> Response:
        return ExecResponse(await agent.exec_stream(sandbox_id, body, epoch))

    @api.post("/v1/sandboxes/{sandbox_id}/commands", status_code=201)
    async def start_command(sandbox_id: str, body: ExecRequest, epoch: EpochHeader = None) -> CommandInfo:
        return await agent.start_command(sandbox_id, body, epoch)

    @api.get("/v1/sandboxes/{sandbox_id}/commands")
    async def list_commands(sandbox_id: str, epoch: EpochHeader = None) -> CommandList:
        return agent.list_commands(sandbox_id, epoch)

    @api.get("/v1/sandboxes/{sandbox_id}/commands/{pid}")
    async def get_command(
        sandbox_id: str, pid: Pid, request: Request, epoch: EpochHeader = None, wait_s: WaitS = 0.0
    ) -> CommandInfo:
        return await unless_caller_goes(request, agent.command(sandbox_id, pid, epoch, wait_s))

    @api.get("/v1/sandboxes/{sandbox_id}/commands/{pid}/output", response_model=None)
    async def command_output(
        sandbox_id: str, pid: Pid, epoch: EpochHeader = None, follow: bool = False
    ) -> CommandOutput | Response:
        if follow:  # its reader going away closes the follower, never the command
            return ExecResponse(agent.follow_command(sandbox_id, pid, epoch))
        return agent.command_output(sandbox_id, pid, epoch)

    @api.post("/v1/sandboxes/{sandbox_id}/commands/{pid}/kill")
    async def kill_command(sandbox_id: str, pid: Pid, epoch: EpochHeader = None) -> CommandInfo:
        return await agent.kill_command(sandbox_id, pid, epoch)

    @api.put("/v1/sandboxes/{sandbox_id}/egress", status_code=204)
    async def set_egress(sandbox_id: str, body: EgressPolicyBody, epoch: EpochHeader = None) -> Response:
        await agent.set_egress(sandbox_id, body, epoch)
        return Response(status_code=204)

    @api.post("/v1/sandboxes/{sandbox_id}/pause")
    async def pause(sandbox_id: str, memory: bool = True) -> SandboxInfo:
        return await agent.pause(sandbox_id, memory=memory)

    @api.post("/v1/sandboxes/{sandbox_id}/resume")
    async def resume(sandbox_id: str, memory: bool = True) -> SandboxInfo:
        return await agent.resume(sandbox_id, memory=memory)

    @api.get("/v1/sandboxes/{sandbox_id}/samples")
    async def samples(
        sandbox_id: str, start: Annotated[float, Query(ge=0)], end: Annotated[float, Query(ge=0)]
    ) -> SandboxSamples:
        return await agent.samples(sandbox_id, start, end)

    @api.get("/v1/capacity")
    async def capacity() -> Capacity:
        return agent.capacity()

    registry = CollectorRegistry(auto_describe=True)
    registry.register(AgentCollector([agent]))

    @api.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.include_router(api)
    app.add_middleware(AgentPorts, agent=agent)
    app.add_middleware(_KeyGate, key_presented=key_presented)

    envd = Envd(agent)

    async def envd_authorized(scope: Scope, receive: Receive, send: Send) -> None:
        if not authorized(Request(scope)):
            await error_response(AgentUnauthorized(message="missing or invalid bearer token"))(
                scope, receive, send
            )
            return
        await envd(scope, receive, send)

    app.mount(ENVD_PREFIX, envd_authorized)
    return app


class _KeyGate:
    """Refuses a call without the host key before its body is read: a stranger's request costs the
    agent one header comparison, whatever it sends after the headers."""

    def __init__(self, app: ASGIApp, key_presented: Callable[[str], bool]) -> None:
        self.app = app
        self.key_presented = key_presented

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"] != "/healthz":
            header = next((v for k, v in scope.get("headers", ()) if k == b"authorization"), b"")
            if not self.key_presented(header.decode("latin-1")):
                if scope["type"] == "websocket":  # a port's WebSocket, relayed by a replica
                    err = AgentUnauthorized(message="missing or invalid bearer token")
                    await refuse(scope, send, err.status, err.code, err.message)
                    return
                response = error_response(AgentUnauthorized(message="missing or invalid bearer token"))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
