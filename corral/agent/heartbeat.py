"""Heartbeat sinks: where an agent's heartbeats go. The agent sends through any
``async def sink(hb: Heartbeat) -> None``; ``corral serve`` passes an in-process callable, a remote agent
uses :class:`HttpHeartbeatSink` against the control plane's agent-facing route."""

from __future__ import annotations

import httpx

from corral.agent.protocol import Heartbeat

HEARTBEAT_PATH = "/v1/agent/heartbeat"


class HeartbeatRejected(Exception):
    """The control plane answered, but not with a 2xx."""

    def __init__(self, status: int, body: str) -> None:
        self.status = status
        super().__init__(f"control plane refused the heartbeat: HTTP {status}: {body[:200]}")


class HttpHeartbeatSink:
    """POSTs each heartbeat to ``{control_plane}/v1/agent/heartbeat`` with the agent's bearer token.

    Raises on a transport error or a non-2xx answer; the agent's heartbeat loop logs it and carries on.
    ``transport`` is the test seam (``httpx.ASGITransport`` over a control-plane app, or a MockTransport).
    """

    def __init__(
        self,
        control_plane: str,
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.url = control_plane.rstrip("/") + HEARTBEAT_PATH
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}"},
        )

    async def __call__(self, hb: Heartbeat) -> None:
        resp = await self._client.post(self.url, content=hb.model_dump_json(), headers=_JSON)
        if not resp.is_success:
            raise HeartbeatRejected(resp.status_code, resp.text)

    async def aclose(self) -> None:
        await self._client.aclose()


_JSON = {"Content-Type": "application/json"}


def http_heartbeat_sink(
    url: str, token: str, transport: httpx.AsyncBaseTransport | None = None, timeout_s: float = 5.0
) -> HttpHeartbeatSink:
    """The agent's default sink: the control plane over HTTP."""
    return HttpHeartbeatSink(url, token, transport, timeout_s)
