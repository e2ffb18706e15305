"""The agent's end of a request to a sandbox's port that a replica relayed:
``/v1/sandboxes/{id}/ports/{port}/...`` (HTTP or a WebSocket upgrade) on the agent's API, behind
its host key (the key gate has checked it before this runs), relayed to the port at the sandbox's
slot address. The routed epoch (``X-Corral-Epoch``) must be the copy's here, as for every call.
The caller's own ``Authorization``, moved aside by the replica, is given back for the sandbox's
server; the host key and the relay's own headers never reach it."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from corral.agent.agent import Agent
from corral.agent.errors import AgentError
from corral.agent.portrelay import PortRelay, raw_path, refuse, request_headers
from corral.agent.protocol import CALLER_AUTH_HEADER, EPOCH_HEADER, HOP_HEADER
from corral.codes import ErrorCode
from corral.core.ingress import BadPort, by_path

_CALLER = CALLER_AUTH_HEADER.encode()
_RELAY_OWN = frozenset({b"authorization", _CALLER, EPOCH_HEADER.lower().encode(), HOP_HEADER.encode()})


class AgentPorts:
    def __init__(self, app: ASGIApp, agent: Agent, relay: PortRelay | None = None) -> None:
        self.app = app
        self.agent = agent
        self.relay = relay or PortRelay()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        try:
            target = by_path(raw_path(scope))
        except BadPort as exc:
            await refuse(scope, send, 422, ErrorCode.INVALID_REQUEST, str(exc))
            return
        if target is None:
            await self.app(scope, receive, send)
            return
        raw = dict(scope["headers"])
        try:
            epoch_text = raw.get(EPOCH_HEADER.lower().encode())
            epoch = int(epoch_text) if epoch_text is not None else None
            address = self.agent.port_address(target.sandbox_id, epoch)
        except ValueError:
            await refuse(scope, send, 422, ErrorCode.INVALID_REQUEST, f"{EPOCH_HEADER} must be an integer")
            return
        except AgentError as exc:
            await refuse(scope, send, exc.status, exc.code, exc.message)
            return
        headers = request_headers(scope, _RELAY_OWN)
        if (caller := raw.get(_CALLER)) is not None:
            headers.append((b"authorization", caller))
        url = f"http://{address}:{target.port}{target.path}"
        await self.relay(scope, receive, send, url, headers)
