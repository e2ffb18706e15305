"""The envd app: the data plane's two services (:mod:`~corral.agent.envd.processes` and
:mod:`~corral.agent.envd.files`) for the sandboxes of this host behind one router, with its health.

Every request names its sandbox in ``E2b-Sandbox-Id``; whoever routed it here has already decided the
caller may reach that sandbox. Everything runs in the sandbox, as its one user, through the runtime's
``spawn`` (the launcher). A request message is at most ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from corral.agent.agent import Agent
from corral.agent.envd.calls import Calls
from corral.agent.envd.connect import RpcError
from corral.agent.envd.files import FILES_MAX_BYTES, IDLE_TIMEOUT_S, Files
from corral.agent.envd.processes import Processes, Run

ENVD_PREFIX = "/envd"  # where an agent's HTTP API serves this
# The envd protocol level served: the SDK sends no user below 0.4.0 assumptions and uploads
# file-like data as octet-stream from 0.5.7.
ENVD_VERSION = "0.5.7"


class Envd:
    def __init__(
        self,
        agent: Agent,
        *,
        files_max_bytes: int = FILES_MAX_BYTES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.agent = agent
        self.calls = Calls(agent)
        self.processes = Processes(self.calls)
        self.files = Files(self.calls, files_max_bytes, idle_timeout_s)
        self.app = Router(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                *self.files.routes(),
                *self.processes.routes(),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    @property
    def output_bytes_read(self) -> int:
        return self.processes.output_bytes_read

    @property
    def _runs(self) -> dict[str, dict[int, Run]]:
        return self.processes.runs

    async def health(self, request: Request) -> Response:
        try:
            self.calls.sandbox(request)
        except RpcError as exc:
            return JSONResponse({"code": 502, "message": exc.message}, status_code=502)
        return Response(status_code=204)
