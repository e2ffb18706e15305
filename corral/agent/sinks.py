"""Heartbeat sinks: how an agent's heartbeats travel (what one holds is
:class:`~corral.agent.protocol.AgentHeartbeat`, how it is built :mod:`corral.agent.beats`). The agent sends
through any :data:`HeartbeatSink`; ``corral serve`` passes an in-process callable, a remote agent uses
:class:`HttpHeartbeatSink` against the control plane's agent-facing route."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import httpx

from corral.agent.protocol import AgentHeartbeat, HeartbeatReply
from corral.agent.replicas import Replicas

HEARTBEAT_PATH = "/v1/agent/heartbeat"

# A sink may answer with the control plane's reply (warm targets); None leaves them as they are.
HeartbeatSink = Callable[[AgentHeartbeat], Awaitable[HeartbeatReply | None]]


class HeartbeatRejected(Exception):
    """The control plane answered, but not with a 2xx."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"control plane refused the heartbeat: HTTP {status}: {body[:200]}")


class HttpHeartbeatSink(Replicas):
    """POSTs each heartbeat to ``{control_plane}/v1/agent/heartbeat`` with the agent's bearer token.

    Given several control-plane URLs (replicas), it sticks to the one that last answered and moves on
    to the next when it does not, so a dead replica never silences a live host: a host whose
    heartbeats stop looks dead, and its reservations are never confirmed.

    Raises when no URL accepted the heartbeat; the agent's heartbeat loop logs it and carries on.
    ``transport`` is the test seam (``httpx.ASGITransport`` over a control-plane app, or a MockTransport).
    """

    @property
    def url(self) -> str:
        return self.bases[self._current] + HEARTBEAT_PATH

    async def __call__(self, hb: AgentHeartbeat) -> HeartbeatReply | None:
        body = hb.model_dump_json()
        error: Exception | None = None
        for i in self._in_turn():
            try:
                resp = await self._client.post(self.bases[i] + HEARTBEAT_PATH, content=body, headers=_JSON)
            except httpx.HTTPError as exc:
                error = exc
                continue
            if resp.is_success:
                self._current = i
                try:
                    return HeartbeatReply.model_validate_json(resp.content)
                except ValueError:
                    return None  # an older control plane: no warm targets
            error = HeartbeatRejected(resp.status_code, resp.text)
            if resp.status_code in (401, 403, 422):
                break  # every replica would say the same
        assert error is not None
        raise error


_JSON = {"Content-Type": "application/json"}


def http_heartbeat_sink(
    url: str | Sequence[str],
    token: str,
    transport: httpx.AsyncBaseTransport | None = None,
    timeout_s: float = 5.0,
) -> HttpHeartbeatSink:
    """The agent's default sink: the control plane over HTTP."""
    return HttpHeartbeatSink(url, token, transport, timeout_s)
