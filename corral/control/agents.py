"""How the control plane reaches a host's agent: in-process (``corral serve``) or over HTTP (``corral
api`` with agents on other machines). One seam, two directories."""

from __future__ import annotations

from abc import ABC, abstractmethod

import httpx

from corral.agent.client import AgentClient, HttpAgentClient
from corral.agent.errors import AgentUnavailable


class AgentDirectory(ABC):
    @abstractmethod
    def client(self, host_id: str, address: str) -> AgentClient:
        """The agent of ``host_id``; raises ``AgentUnavailable`` if it cannot be addressed."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass


class LocalAgents(AgentDirectory):
    """Agents living in this process, called directly through the same interface; any other host is
    reached through ``remote`` (agents that joined over the network), if given."""

    def __init__(self, remote: AgentDirectory | None = None) -> None:
        self._clients: dict[str, AgentClient] = {}
        self._remote = remote

    def add(self, host_id: str, client: AgentClient) -> None:
        self._clients[host_id] = client

    def client(self, host_id: str, address: str) -> AgentClient:
        local = self._clients.get(host_id)
        if local is not None:
            return local
        if self._remote is not None:
            return self._remote.client(host_id, address)
        raise AgentUnavailable(message=f"no local agent for host {host_id}")

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.aclose()
        if self._remote is not None:
            await self._remote.aclose()


class HttpAgents(AgentDirectory):
    """Agents at the address they published in their heartbeats, authenticated with the agent token."""

    def __init__(self, token: str, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._token = token
        self._transport = transport
        self._clients: dict[str, HttpAgentClient] = {}

    def client(self, host_id: str, address: str) -> AgentClient:
        if not address:
            raise AgentUnavailable(message=f"host {host_id} published no address")
        c = self._clients.get(address)
        if c is None:
            c = self._clients[address] = HttpAgentClient(address, self._token, transport=self._transport)
        return c

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()
