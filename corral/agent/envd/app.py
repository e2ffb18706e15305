"""The envd app: the data plane's two services (:mod:`~corral.agent.envd.processes`, and
:mod:`~corral.agent.envd.files` with :mod:`~corral.agent.envd.watch`) for the sandboxes of this host
behind one router, with its health.

Every request names its sandbox in ``E2b-Sandbox-Id``; whoever routed it here has already decided the
caller may reach that sandbox. Everything runs in the sandbox, as its one user, through the runtime's
``spawn`` (the launcher). A request message is at most ``MAX_MESSAGE_BYTES``.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from corral.agent.agent import Agent
from corral.agent.envd.calls import MAX_MESSAGE_BYTES, Calls
from corral.agent.envd.connect import STREAM_CONTENT_TYPE, JsonAnswer, RpcError, end_stream
from corral.agent.envd.files import FILES_MAX_BYTES, IDLE_TIMEOUT_S, Files
from corral.agent.envd.processes import Processes, Run
from corral.agent.envd.watch import Watches

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
        self.watches = Watches(self.calls)
        self.app = Router(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                *self.files.routes(),
                *self.watches.routes(),
                *self.processes.routes(),
            ],
            default=self.unimplemented,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except HTTPException as exc:  # a known path under another method: raised before any answer
            await _drain(receive)
            body = {"code": exc.status_code, "message": str(exc.detail)}
            await JsonAnswer(body, status_code=exc.status_code)(scope, receive, send)

    async def unimplemented(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A call this data plane does not serve, answered in its protocol's terms (Connect's
        ``unimplemented``; a stream's in its end envelope), its body read so the connection lives on."""
        await _drain(receive)
        path: str = scope["path"]
        exc = RpcError("unimplemented", f"{path.lstrip('/') or '/'} is not served by corral's data plane")
        content_type = dict(scope["headers"]).get(b"content-type", b"").decode("latin-1")
        if content_type.startswith(STREAM_CONTENT_TYPE):
            answer: Response = Response(end_stream(exc), media_type=STREAM_CONTENT_TYPE)
        else:
            answer = JsonAnswer(exc.body(), status_code=exc.status)
        await answer(scope, receive, send)

    @property
    def output_bytes_read(self) -> int:
        return self.processes.output_bytes_read

    @property
    def _runs(self) -> dict[str, dict[int, Run]]:
        return self.processes.runs

    async def health(self, request: Request) -> Response:
        try:
            sandbox_id = self.calls.sandbox(request)
        except RpcError as exc:
            return JsonAnswer({"code": 502, "message": exc.message}, status_code=502)
        if self.agent.get(sandbox_id).paused:  # as E2B's proxy answers for a paused sandbox
            return JsonAnswer({"code": 502, "message": f"sandbox {sandbox_id} is paused"}, status_code=502)
        return Response(status_code=204)


async def _drain(receive: Receive, limit: int = MAX_MESSAGE_BYTES) -> None:
    """Read what is left of a request's body (at most ``limit`` bytes), so the reply can be followed by
    the client's next request on the same connection."""
    read = 0
    while read <= limit:
        message = await receive()
        if message["type"] != "http.request":
            return
        read += len(message.get("body", b""))
        if not message.get("more_body"):
            return
