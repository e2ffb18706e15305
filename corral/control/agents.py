"""How the control plane reaches a host's agent: in-process (``corral serve``) or over HTTP (``corral
api`` with agents on other machines). One seam, two directories."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

import httpx

from corral.agent.client import AgentClient, HttpAgentClient
from corral.agent.errors import AgentUnavailable

# The key a host's agent expects from the control plane, looked up by host id (None: not enrolled).
KeyLookup = Callable[[str], Awaitable[str | None]]


class AgentDirectory(ABC):
    @abstractmethod
    def client(self, host_id: str, address: str) -> AgentClient:
        """The agent of ``host_id``; raises ``AgentUnavailable`` if it cannot be addressed."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        pass

    def forget_key(self, host_id: str) -> None:  # noqa: B027 - optional hook
        """The host was re-enrolled or forgotten: a key cached for it is stale."""


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

    def forget_key(self, host_id: str) -> None:
        if self._remote is not None:
            self._remote.forget_key(host_id)


class HttpAgents(AgentDirectory):
    """Agents at the address they published in their heartbeats. Each is called with its own host's
    key (from ``keys``, cached until the agent refuses it), so no fleet-wide secret is ever sent to
    an address a host chose. ``shared_token``: the development mode where every agent holds one
    token instead."""

    def __init__(
        self,
        keys: KeyLookup | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        *,
        shared_token: str | None = None,
    ) -> None:
        if keys is None and shared_token is None:
            raise ValueError("agents need either per-host keys or a shared development token")
        self._keys = keys
        self._shared = shared_token
        self._transport = transport
        self._cached: dict[str, str] = {}
        self._clients: dict[tuple[str, str], HttpAgentClient] = {}

    async def _key(self, host_id: str) -> str:
        cached = self._cached.get(host_id)
        if cached is not None:
            return cached
        key = await self._keys(host_id) if self._keys is not None else None
        if key is None:
            if self._shared is None:
                raise AgentUnavailable(message=f"host {host_id} is not enrolled")
            return self._shared
        self._cached[host_id] = key
        return key

    def forget_key(self, host_id: str) -> None:
        self._cached.pop(host_id, None)

    def client(self, host_id: str, address: str) -> AgentClient:
        if not address:
            raise AgentUnavailable(message=f"host {host_id} published no address")
        c = self._clients.get((host_id, address))
        if c is None:

            async def key() -> str:
                return await self._key(host_id)

            c = HttpAgentClient(
                address, key, transport=self._transport, on_refused=lambda: self.forget_key(host_id)
            )
            self._clients[(host_id, address)] = c
        return c

    async def aclose(self) -> None:
        for c in self._clients.values():
            await c.aclose()
        self._clients.clear()
