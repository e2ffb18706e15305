"""The in-memory agent client shipped for tests and the simulator: a control plane's connection to a
real :class:`~corral.agent.agent.Agent` in this process, through the same :class:`AgentClient`
interface as the wire. A subclass says which agent a call reaches, or raises as the wire would (a host
down, a replica gone, a network that loses replies). ``corral serve`` calls its agents through
:class:`corral.agent.client.LocalAgentClient`, which cannot fail on the way."""

from __future__ import annotations

from abc import abstractmethod

from corral.agent.agent import Agent
from corral.agent.client import AgentClient
from corral.agent.execstream import ExecEvents
from corral.agent.protocol import (
    Capacity,
    ClaimWarm,
    ExecRequest,
    SandboxInfo,
    SandboxSamples,
    StartSandbox,
)
from corral.exec_result import ExecResult
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput


class InMemoryAgentClient(AgentClient):
    """A connection to a real agent in this process: ``_agent`` says which, or raises when it cannot
    be reached; the calls that cannot fail on the way go straight through."""

    @abstractmethod
    def _agent(self) -> Agent:
        """The agent this connection reaches; raises as the wire would when it cannot."""

    async def start(self, req: StartSandbox) -> SandboxInfo:
        return await self._agent().start(req)

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        await self._agent().stop(sandbox_id, epoch)

    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        return await self._agent().exec(sandbox_id, req, epoch)

    async def start_command(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> CommandInfo:
        return await self._agent().start_command(sandbox_id, req, epoch)

    async def list_commands(self, sandbox_id: str, epoch: int | None = None) -> CommandList:
        return self._agent().list_commands(sandbox_id, epoch)

    async def command(
        self, sandbox_id: str, pid: int, epoch: int | None = None, wait_s: float = 0.0
    ) -> CommandInfo:
        return await self._agent().command(sandbox_id, pid, epoch, wait_s)

    async def command_output(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandOutput:
        return self._agent().command_output(sandbox_id, pid, epoch)

    async def follow_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> ExecEvents:
        return self._agent().follow_command(sandbox_id, pid, epoch)

    async def kill_command(self, sandbox_id: str, pid: int, epoch: int | None = None) -> CommandInfo:
        return await self._agent().kill_command(sandbox_id, pid, epoch)

    async def list(self) -> list[SandboxInfo]:
        return self._agent().list()

    async def get(self, sandbox_id: str) -> SandboxInfo:
        return await self._agent().read(sandbox_id)

    async def capacity(self) -> Capacity:
        return self._agent().capacity()

    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        return await self._agent().samples(sandbox_id, start, end)

    async def claim(self, template: str, req: ClaimWarm) -> SandboxInfo:
        return self._agent().claim(template, req)
