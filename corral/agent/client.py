"""How the control plane talks to an agent, whether it runs in-process or across the network.

Both implementations raise the same exceptions for the same situations: :class:`AgentRefusal` for a
retryable refusal (try another host), :class:`AgentSandboxNotFound`, :class:`AgentUnavailable` when the
agent cannot be reached, and other :class:`AgentError` subclasses (conflict, invalid input, runtime error)
with the agent's stable code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any
from urllib.parse import quote

import httpx
from pydantic import TypeAdapter, ValidationError

from corral.agent.agent import Agent
from corral.agent.errors import (
    AgentError,
    AgentRefusal,
    AgentSandboxNotFound,
    AgentUnavailable,
    Code,
    error_from_response,
)
from corral.agent.protocol import Capacity, ExecRequest, ExecResponse, SandboxInfo, StartSandbox

__all__ = [
    "AgentClient",
    "AgentError",
    "AgentRefusal",
    "AgentSandboxNotFound",
    "AgentUnavailable",
    "HttpAgentClient",
    "LocalAgentClient",
]


class AgentClient(ABC):
    @abstractmethod
    async def start(self, req: StartSandbox) -> SandboxInfo: ...

    @abstractmethod
    async def stop(self, sandbox_id: str) -> None: ...

    @abstractmethod
    async def exec(self, sandbox_id: str, req: ExecRequest) -> ExecResponse: ...

    @abstractmethod
    async def list(self) -> list[SandboxInfo]: ...

    async def pause(self, sandbox_id: str) -> SandboxInfo:
        raise AgentError(Code.RUNTIME_FAILED, "this agent cannot pause sandboxes")

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        raise AgentError(Code.RUNTIME_FAILED, "this agent cannot resume sandboxes")

    @abstractmethod
    async def capacity(self) -> Capacity: ...

    async def aclose(self) -> None:  # noqa: B027 - optional hook; most clients hold nothing
        """Release what the client holds (connections)."""


class LocalAgentClient(AgentClient):
    """Calls an in-process :class:`Agent` directly (``corral serve``)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def start(self, req: StartSandbox) -> SandboxInfo:
        return await self.agent.start(req)

    async def stop(self, sandbox_id: str) -> None:
        await self.agent.stop(sandbox_id)

    async def exec(self, sandbox_id: str, req: ExecRequest) -> ExecResponse:
        return await self.agent.exec(sandbox_id, req)

    async def list(self) -> list[SandboxInfo]:
        return self.agent.list()

    async def pause(self, sandbox_id: str) -> SandboxInfo:
        return await self.agent.pause(sandbox_id)

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        return await self.agent.resume(sandbox_id)

    async def capacity(self) -> Capacity:
        return self.agent.capacity()


_INFOS = TypeAdapter(list[SandboxInfo])


class HttpAgentClient(AgentClient):
    """Talks to an agent's HTTP API. ``transport`` is the test seam (``httpx.ASGITransport(app)``)."""

    def __init__(
        self,
        base_url: str,
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
    ) -> None:
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            transport=transport,
            timeout=timeout_s,
            headers={"Authorization": f"Bearer {token}"},
        )

    async def _call(self, method: str, path: str, body: Any = None, timeout_s: float | None = None) -> Any:
        kwargs: dict[str, Any] = {}
        if body is not None:
            kwargs["content"] = body.model_dump_json()
            kwargs["headers"] = {"Content-Type": "application/json"}
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        try:
            resp = await self._client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise AgentUnavailable(message=f"agent unreachable: {exc!r}") from exc
        if resp.is_success:
            if resp.status_code == 204 or not resp.content:
                return None
            try:
                return resp.json()
            except ValueError as exc:
                raise AgentUnavailable(message="agent answered with something that is not JSON") from exc
        try:
            payload = resp.json()
        except ValueError:
            payload = None
        raise error_from_response(resp.status_code, payload)

    @staticmethod
    def _parse(model: Any, data: Any) -> Any:
        try:
            return (
                model.validate_python(data) if isinstance(model, TypeAdapter) else model.model_validate(data)
            )
        except ValidationError as exc:
            raise AgentUnavailable(message=f"agent answered with an unexpected body: {exc}") from exc

    async def start(self, req: StartSandbox) -> SandboxInfo:
        result: SandboxInfo = self._parse(SandboxInfo, await self._call("POST", "/v1/sandboxes", req))
        return result

    async def stop(self, sandbox_id: str) -> None:
        await self._call("DELETE", f"/v1/sandboxes/{quote(sandbox_id, safe='')}")

    async def exec(self, sandbox_id: str, req: ExecRequest) -> ExecResponse:
        path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}/exec"
        # The command may legitimately run for its whole timeout: give the HTTP call a little more.
        data = await self._call("POST", path, req, timeout_s=req.timeout_s + 10.0)
        result: ExecResponse = self._parse(ExecResponse, data)
        return result

    async def list(self) -> list[SandboxInfo]:
        result: list[SandboxInfo] = self._parse(_INFOS, await self._call("GET", "/v1/sandboxes"))
        return result

    async def capacity(self) -> Capacity:
        result: Capacity = self._parse(Capacity, await self._call("GET", "/v1/capacity"))
        return result

    async def _sandbox_op(self, sandbox_id: str, op: str) -> SandboxInfo:
        data = await self._call("POST", f"/v1/sandboxes/{quote(sandbox_id, safe='')}/{op}")
        result: SandboxInfo = self._parse(SandboxInfo, data)
        return result

    async def pause(self, sandbox_id: str) -> SandboxInfo:
        return await self._sandbox_op(sandbox_id, "pause")

    async def resume(self, sandbox_id: str) -> SandboxInfo:
        return await self._sandbox_op(sandbox_id, "resume")

    @property
    def http(self) -> httpx.AsyncClient:
        """The authenticated connection to the agent, for calls streamed through it as they are."""
        return self._client

    async def aclose(self) -> None:
        await self._client.aclose()
