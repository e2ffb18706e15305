"""Starting a reserved sandbox on its host's agent, and what each way an agent can say no means for
the create: try another host (counted under its reason), or end the create with a 502."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from corral.agent.errors import AgentError, AgentRefusal, AgentUnavailable
from corral.agent.protocol import StartSandbox
from corral.codes import ErrorCode
from corral.control.deadlines import Deadlines
from corral.control.errors import BadGateway
from corral.control.ports import AgentLookup
from corral.images.config import ImageConfig
from corral.store import SandboxRecord

# Refusals that say "not this host" rather than "not now": another host may well take it.
_ELSEWHERE = {ErrorCode.TEMPLATE_MISSING}


def elsewhere_reason(exc: BaseException) -> str | None:
    """Why a failed bind should be tried on another host, or None when it should end the create.

    A refusal (starts saturated, memory pressure, does not fit) is "not now, not here"; an agent
    that cannot be reached or answers too late may be gone. Neither is a reason to give up on the
    fleet, and neither marks the host dead: it is only excluded from this create.
    """
    if isinstance(exc, AgentRefusal):
        return exc.code
    if isinstance(exc, AgentUnavailable | TimeoutError):
        return ErrorCode.AGENT_UNAVAILABLE
    if isinstance(exc, AgentError) and exc.code in _ELSEWHERE:
        return exc.code
    return None


def as_bad_gateway(host_id: str, exc: AgentError) -> BadGateway:
    return BadGateway(f"host {host_id} could not start the sandbox: {exc.message}", code=exc.code)


class Binder:
    def __init__(self, agents: AgentLookup, bind_timeout_s: float) -> None:
        self.agents = agents
        # Every start waits under the same limit: one timer for all of them (see ``Deadlines``).
        self._deadlines = Deadlines(bind_timeout_s)

    async def start(
        self,
        record: SandboxRecord,
        host_id: str,
        address: str,
        env: Mapping[str, str],
        pids: int | None = None,
        secrets: Mapping[str, str] | None = None,
        image: ImageConfig | None = None,
    ) -> None:
        start = StartSandbox.of(record, env, secrets or {}, pids, image)
        client = self.agents.client(host_id, address)
        with self._deadlines.watch():
            await client.start(start)

    async def stop_quietly(self, host_id: str, address: str, sandbox_id: str) -> None:
        """A bind that failed late (timed out, or its record could not be written) may still have
        started the sandbox: make sure it is not left running. Best effort; the reconciler stops
        any stray a host reports later."""
        with contextlib.suppress(Exception):
            await self.agents.client(host_id, address).stop(sandbox_id)
