"""How the control plane talks to an agent, whether it runs in-process or across the network.

Both implementations raise the same exceptions for the same situations: :class:`AgentRefusal` for a
retryable refusal (try another host), :class:`AgentSandboxNotFound`, :class:`AgentUnavailable` when the
agent cannot be reached, and other :class:`AgentError` subclasses (conflict, invalid input, runtime error)
with the agent's stable code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable
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
    AgentWarmEmpty,
    error_from_response,
)
from corral.agent.execstream import ExecEvents
from corral.agent.protocol import (
    EPOCH_HEADER,
    Capacity,
    ClaimWarm,
    EgressPolicyBody,
    ExecRequest,
    SandboxInfo,
    SandboxSamples,
    StartSandbox,
)
from corral.codes import ErrorCode
from corral.exec_result import (
    ANSWER_MARGIN_S,
    KEEPALIVE_S,
    ExecEvent,
    ExecResult,
    ExecStreamError,
    decode_event,
)
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput

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
    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        """Stop it; with ``epoch``, only the copy of that epoch (another is refused as stale)."""

    @abstractmethod
    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        """Run a command in it; with ``epoch``, only in the copy of that epoch."""

    async def exec_stream(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecEvents:
        """Start a command whose output comes as it is written; closing the stream kills it."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot stream a command")

    async def start_command(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> CommandInfo:
        """Start a background command: it runs on after this call, until it ends or is killed."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot run background commands")

    async def list_commands(self, sandbox_id: str, epoch: int | None = None) -> CommandList:
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot run background commands")

    async def command(
        self, sandbox_id: str, pid: int, epoch: int | None = None, wait_s: float = 0.0
    ) -> CommandInfo:
        """A background command's state; with ``wait_s``, once it has ended or after that long."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot run background commands")

    async def command_output(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandOutput:
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot run background commands")

    async def follow_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> ExecEvents:
        """Its kept output, then what comes, then how it ended; closing the stream never ends it."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot run background commands")

    async def kill_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandInfo:
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot run background commands")

    @abstractmethod
    async def list(self) -> list[SandboxInfo]: ...

    async def get(self, sandbox_id: str) -> SandboxInfo:
        """One sandbox as its host sees it now, what its disk holds included."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot describe one sandbox")

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        """Freeze it in place (``memory``), or end its processes and keep its files (not ``memory``)."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot pause sandboxes")

    async def resume(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        """Thaw it; not ``memory``: as a reboot, its processes ended first, its files kept."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot resume sandboxes")

    @abstractmethod
    async def capacity(self) -> Capacity: ...

    @abstractmethod
    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        """The sandbox's memory readings from ``start`` to ``end`` (unix seconds)."""

    async def claim(self, template: str, req: ClaimWarm) -> SandboxInfo:
        """Take one ready warm sandbox of ``template``; raises ``AgentWarmEmpty`` when none is left."""
        raise AgentWarmEmpty(message="this agent keeps no warm sandboxes")

    async def set_egress(self, sandbox_id: str, body: EgressPolicyBody, epoch: int | None = None) -> None:
        """Replace a running sandbox's egress policy, atomically."""
        raise AgentError(ErrorCode.RUNTIME_FAILED, "this agent cannot change egress policies")

    async def aclose(self) -> None:  # noqa: B027 - optional hook; most clients hold nothing
        """Release what the client holds (connections)."""


class LocalAgentClient(AgentClient):
    """Calls an in-process :class:`Agent` directly (``corral serve``)."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def start(self, req: StartSandbox) -> SandboxInfo:
        return await self.agent.start(req)

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        await self.agent.stop(sandbox_id, epoch)

    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        return await self.agent.exec(sandbox_id, req, epoch)

    async def exec_stream(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecEvents:
        return await self.agent.exec_stream(sandbox_id, req, epoch)

    async def start_command(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> CommandInfo:
        return await self.agent.start_command(sandbox_id, req, epoch)

    async def list_commands(self, sandbox_id: str, epoch: int | None = None) -> CommandList:
        return self.agent.list_commands(sandbox_id, epoch)

    async def command(
        self, sandbox_id: str, pid: int, epoch: int | None = None, wait_s: float = 0.0
    ) -> CommandInfo:
        return await self.agent.command(sandbox_id, pid, epoch, wait_s)

    async def command_output(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandOutput:
        return self.agent.command_output(sandbox_id, pid, epoch)

    async def follow_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> ExecEvents:
        return self.agent.follow_command(sandbox_id, pid, epoch)

    async def kill_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandInfo:
        return await self.agent.kill_command(sandbox_id, pid, epoch)

    async def list(self) -> list[SandboxInfo]:
        return self.agent.list()

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await self.agent.read(sandbox_id)

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        return await self.agent.pause(sandbox_id, memory=memory)

    async def resume(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        return await self.agent.resume(sandbox_id, memory=memory)

    async def capacity(self) -> Capacity:
        return self.agent.capacity()

    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        return await self.agent.samples(sandbox_id, start, end)

    async def claim(self, template: str, req: ClaimWarm) -> SandboxInfo:
        return self.agent.claim(template, req)

    async def set_egress(self, sandbox_id: str, body: EgressPolicyBody, epoch: int | None = None) -> None:
        await self.agent.set_egress(sandbox_id, body, epoch)


_INFOS = TypeAdapter(list[SandboxInfo])


class HttpAgentClient(AgentClient):
    """Talks to an agent's HTTP API. ``transport`` is the test seam (``httpx.ASGITransport(app)``).

    ``token`` is the host's key, or a coroutine function giving it (looked up when first needed);
    ``on_refused`` runs when the agent answers 401, so a key that was rotated is looked up again."""

    def __init__(
        self,
        base_url: str,
        token: str | Callable[[], Awaitable[str]],
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 30.0,
        on_refused: Callable[[], None] | None = None,
    ) -> None:
        self._token = token
        self._on_refused = on_refused
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), transport=transport, timeout=timeout_s
        )

    async def _auth(self) -> dict[str, str]:
        token = self._token if isinstance(self._token, str) else await self._token()
        return {"Authorization": f"Bearer {token}"}

    async def _send(
        self,
        method: str,
        path: str,
        body: Any,
        timeout_s: float | httpx.Timeout | None,
        epoch: int | None = None,
        *,
        stream: bool = False,
    ) -> httpx.Response:
        kwargs: dict[str, Any] = {}
        headers = await self._auth()
        if epoch is not None:
            headers[EPOCH_HEADER] = str(epoch)
        if body is not None:
            kwargs["content"] = body.model_dump_json()
            headers["Content-Type"] = "application/json"
        kwargs["headers"] = headers
        if timeout_s is not None:
            kwargs["timeout"] = timeout_s
        try:
            request = self._client.build_request(method, path, **kwargs)
            return await self._client.send(request, stream=stream)
        except httpx.HTTPError as exc:
            raise AgentUnavailable(message=f"agent unreachable: {exc!r}") from exc

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout_s: float | None = None,
        epoch: int | None = None,
    ) -> Any:
        resp = await self._send(method, path, body, timeout_s, epoch)
        if resp.status_code == 401 and self._on_refused is not None:
            # The host was re-enrolled since its key was cached: look it up again, once. The agent
            # refused before doing anything, so even a start is safe to send again.
            self._on_refused()
            resp = await self._send(method, path, body, timeout_s, epoch)
        if resp.is_success:
            if resp.status_code == 204 or not resp.content:
                return None
            try:
                return resp.json()
            except ValueError as exc:
                raise AgentUnavailable(message="agent answered with something that is not JSON") from exc
        raise _refusal(resp)

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

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        await self._call("DELETE", f"/v1/sandboxes/{quote(sandbox_id, safe='')}", epoch=epoch)

    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}/exec"
        # The command may legitimately run for its whole timeout: give the HTTP call a little more.
        data = await self._call("POST", path, req, timeout_s=req.timeout_s + ANSWER_MARGIN_S, epoch=epoch)
        result: ExecResult = self._parse(ExecResult, data)
        return result

    async def exec_stream(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecEvents:
        path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}/exec/stream"
        # Silence between lines lasts at most a keepalive; the whole answer, the command's timeout.
        timeout = httpx.Timeout(10.0, read=req.timeout_s + ANSWER_MARGIN_S)
        return await self._events("POST", path, req, timeout, epoch)

    async def _events(
        self, method: str, path: str, body: Any, timeout: httpx.Timeout, epoch: int | None
    ) -> ExecEvents:
        """A call answered by a streamed command's lines, as its events; its refusal, raised."""
        resp = await self._send(method, path, body, timeout, epoch, stream=True)
        if resp.status_code == 401 and self._on_refused is not None:
            await resp.aclose()
            self._on_refused()
            resp = await self._send(method, path, body, timeout, epoch, stream=True)
        if not resp.is_success:
            try:
                await resp.aread()
            except httpx.HTTPError as exc:
                raise AgentUnavailable(message=f"agent unreachable: {exc!r}") from exc
            finally:
                await resp.aclose()
            raise _refusal(resp)
        return _RemoteExec(resp)

    @staticmethod
    def _commands_path(sandbox_id: str, pid: int | None = None, tail: str = "") -> str:
        path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}/commands"
        return path if pid is None else f"{path}/{pid}{tail}"

    async def start_command(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> CommandInfo:
        data = await self._call("POST", self._commands_path(sandbox_id), req, epoch=epoch)
        result: CommandInfo = self._parse(CommandInfo, data)
        return result

    async def list_commands(self, sandbox_id: str, epoch: int | None = None) -> CommandList:
        data = await self._call("GET", self._commands_path(sandbox_id), epoch=epoch)
        result: CommandList = self._parse(CommandList, data)
        return result

    async def command(
        self, sandbox_id: str, pid: int, epoch: int | None = None, wait_s: float = 0.0
    ) -> CommandInfo:
        path = self._commands_path(sandbox_id, pid, f"?wait_s={wait_s:g}" if wait_s > 0 else "")
        data = await self._call("GET", path, timeout_s=wait_s + ANSWER_MARGIN_S, epoch=epoch)
        result: CommandInfo = self._parse(CommandInfo, data)
        return result

    async def command_output(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandOutput:
        data = await self._call("GET", self._commands_path(sandbox_id, pid, "/output"), epoch=epoch)
        result: CommandOutput = self._parse(CommandOutput, data)
        return result

    async def follow_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> ExecEvents:
        path = self._commands_path(sandbox_id, pid, "/output?follow=true")
        # Followed until it ends (at its timeout at the latest); silent at most a keepalive at a time.
        timeout = httpx.Timeout(10.0, read=KEEPALIVE_S + ANSWER_MARGIN_S)
        return await self._events("GET", path, None, timeout, epoch)

    async def kill_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandInfo:
        data = await self._call("POST", self._commands_path(sandbox_id, pid, "/kill"), epoch=epoch)
        result: CommandInfo = self._parse(CommandInfo, data)
        return result

    async def list(self) -> list[SandboxInfo]:
        result: list[SandboxInfo] = self._parse(_INFOS, await self._call("GET", "/v1/sandboxes"))
        return result

    async def get(self, sandbox_id: str) -> SandboxInfo:
        path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}"
        result: SandboxInfo = self._parse(SandboxInfo, await self._call("GET", path))
        return result

    async def capacity(self) -> Capacity:
        result: Capacity = self._parse(Capacity, await self._call("GET", "/v1/capacity"))
        return result

    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        path = f"/v1/sandboxes/{quote(sandbox_id, safe='')}/samples?start={start!r}&end={end!r}"
        result: SandboxSamples = self._parse(SandboxSamples, await self._call("GET", path))
        return result

    async def claim(self, template: str, req: ClaimWarm) -> SandboxInfo:
        path = f"/v1/warm/{quote(template, safe='')}/claim"
        result: SandboxInfo = self._parse(SandboxInfo, await self._call("POST", path, req))
        return result

    async def set_egress(self, sandbox_id: str, body: EgressPolicyBody, epoch: int | None = None) -> None:
        await self._call("PUT", f"/v1/sandboxes/{quote(sandbox_id, safe='')}/egress", body, epoch=epoch)

    async def _sandbox_op(self, sandbox_id: str, op: str, memory: bool) -> SandboxInfo:
        query = "" if memory else "?memory=false"
        data = await self._call("POST", f"/v1/sandboxes/{quote(sandbox_id, safe='')}/{op}{query}")
        result: SandboxInfo = self._parse(SandboxInfo, data)
        return result

    async def pause(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        return await self._sandbox_op(sandbox_id, "pause", memory)

    async def resume(self, sandbox_id: str, *, memory: bool = True) -> SandboxInfo:
        return await self._sandbox_op(sandbox_id, "resume", memory)

    @property
    def http(self) -> httpx.AsyncClient:
        """The connection to the agent, for calls streamed through it as they are; each such call
        carries :meth:`auth_headers`."""
        return self._client

    async def auth_headers(self) -> dict[str, str]:
        """What proves this control plane to the agent: the host's key."""
        return await self._auth()

    async def aclose(self) -> None:
        await self._client.aclose()


def _refusal(resp: httpx.Response) -> AgentError:
    try:
        payload = resp.json()
    except ValueError:
        payload = None
    return error_from_response(resp.status_code, payload)


class _RemoteExec:
    """A command streamed from an agent over HTTP; closing the answer is what kills it there (a
    streamed exec) or stops following it (a background command)."""

    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp

    async def events(self) -> AsyncIterator[ExecEvent | None]:
        ended = False
        try:
            async for line in self._resp.aiter_lines():
                if not line:
                    continue
                event = decode_event(line)
                ended = isinstance(event, ExecResult | ExecStreamError)
                yield event
                if ended:
                    return
        except (httpx.HTTPError, ValueError) as exc:
            yield ExecStreamError(
                code=ErrorCode.HOST_UNREACHABLE, message=f"the sandbox's host went away: {exc!r}"
            )
            return
        if not ended:
            yield ExecStreamError(
                code=ErrorCode.HOST_UNREACHABLE, message="the sandbox's host ended the answer early"
            )

    async def aclose(self) -> None:
        await self._resp.aclose()
