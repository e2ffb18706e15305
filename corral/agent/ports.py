"""The agent's end of a request to a sandbox's port that a replica relayed:
``/v1/sandboxes/{id}/ports/{port}/...`` (HTTP or a WebSocket upgrade) on the agent's API, behind
its host key (the key gate has checked it before this runs), relayed to the port at the sandbox's
slot address. The routed epoch (``X-Corral-Epoch``) must be the copy's here, as for every call.
The caller's own ``Authorization``, moved aside by the replica, is given back for the sandbox's
server; the host key and the relay's own headers never reach it. Plain HTTP/1.1 requests are spliced
as bytes before the agent's parser (:class:`PortPlan`, :mod:`corral.agent.portsplice`) by the same
rules; the rest (refusals among it) is answered here."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from starlette.types import ASGIApp, Receive, Scope, Send

from corral.agent.agent import Agent
from corral.agent.errors import AgentError
from corral.agent.portrelay import PortRelay, raw_path, refuse, request_headers
from corral.agent.portsplice import Splice
from corral.agent.protocol import CALLER_AUTH_HEADER, EPOCH_HEADER, HOP_HEADER
from corral.codes import ErrorCode
from corral.core.httphead import SPLICE_DROPS, RequestHead, render_request
from corral.core.ingress import BadPort, by_path

_CALLER = CALLER_AUTH_HEADER.encode()
_RELAY_OWN = frozenset({b"authorization", _CALLER, EPOCH_HEADER.lower().encode(), HOP_HEADER.encode()})
_EPOCH = EPOCH_HEADER.lower().encode()


def port_address(agent: Agent, sandbox_id: str, raw: Mapping[bytes, bytes]) -> str:
    """The sandbox's slot address, for the routed epoch the request carries (:class:`ValueError`
    when that is not a number, :class:`AgentError` when the sandbox is not reachable here)."""
    epoch_text = raw.get(_EPOCH)
    return agent.port_address(sandbox_id, int(epoch_text) if epoch_text is not None else None)


def given_back(headers: list[tuple[bytes, bytes]], raw: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes]]:
    """``headers`` with the caller's own ``Authorization`` (moved aside by the replica) given back."""
    if (caller := raw.get(_CALLER)) is not None:
        headers.append((b"authorization", caller))
    return headers


class PortPlan:
    """Where the agent's byte relay sends a request it read; None for what the ASGI path answers (not
    a port request, no host key, a bad epoch, a sandbox not reachable here)."""

    def __init__(self, agent: Agent, key_presented: Callable[[str], bool]) -> None:
        self.agent = agent
        self.key_presented = key_presented

    async def __call__(self, head: RequestHead) -> Splice | None:
        try:
            target = by_path(head.target.partition(b"?")[0].decode("latin-1"))
        except BadPort:
            return None
        raw = dict(head.headers)
        # The first Authorization, as the key gate reads it (a dict keeps the last).
        key = head.header(b"authorization") or b""
        if target is None or not self.key_presented(key.decode("latin-1")):
            return None
        try:
            address = port_address(self.agent, target.sandbox_id, raw)
        except (ValueError, AgentError):
            return None
        query = head.target.partition(b"?")[2]
        to = target.path.encode("latin-1") + (b"?" + query if query else b"")
        drop = SPLICE_DROPS | _RELAY_OWN
        headers = given_back([(k, v) for k, v in head.headers if k not in drop], raw)
        return Splice(address, target.port, render_request(head.method, to, tuple(headers)), _nothing)


def _nothing() -> None:
    """An agent bounds port requests by nothing of its own (its replicas do)."""


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
            address = port_address(self.agent, target.sandbox_id, raw)
        except ValueError:
            await refuse(scope, send, 422, ErrorCode.INVALID_REQUEST, f"{EPOCH_HEADER} must be an integer")
            return
        except AgentError as exc:
            await refuse(scope, send, exc.status, exc.code, exc.message)
            return
        headers = given_back(request_headers(scope, _RELAY_OWN), raw)
        url = f"http://{address}:{target.port}{target.path}"
        await self.relay(scope, receive, send, url, headers)
