"""A sandbox's egress policy on the control plane's side: checked once (the core's parser, with the
codes the API answers), kept on the record, sent with its start, and changed on a running sandbox
by its host first (one nft transaction there), then on its record."""

from __future__ import annotations

import json
from collections.abc import Mapping

from corral.agent.errors import (
    AgentConflict,
    AgentError,
    AgentInvalid,
    AgentSandboxNotFound,
    AgentUnavailable,
)
from corral.codes import ErrorCode
from corral.control.errors import BadGateway, Conflict, InvalidRequest, ResourceNotFound, Unavailable
from corral.core.netpolicy import NO_NETWORK, EgressPolicy, PolicyError, parse_policy
from corral.store import SandboxRecord
from corral.store.records import network_text


def checked(data: Mapping[str, object] | None) -> EgressPolicy:
    """The policy a create or an update asks for; a 422 naming the part that cannot be enforced."""
    if data is None:
        return NO_NETWORK
    try:
        return parse_policy(data)
    except PolicyError as exc:
        error = InvalidRequest(f"network.{exc.field}", f"network.{exc.field}: {exc}")
        if exc.hostname:
            error.code = ErrorCode.NETWORK_HOSTNAMES_UNSUPPORTED
        raise error from None


def policy_of(record: SandboxRecord) -> EgressPolicy:
    return NO_NETWORK if record.network is None else parse_policy(json.loads(record.network))


def agent_failure(sandbox_id: str, host_id: str, exc: AgentError) -> Exception:
    """What an agent's refusal to change a policy is to the API."""
    if isinstance(exc, AgentSandboxNotFound):
        return ResourceNotFound(f"sandbox {sandbox_id} is not running on its host")
    if isinstance(exc, AgentUnavailable):
        return Unavailable(f"host {host_id} is unreachable", code=ErrorCode.HOST_UNREACHABLE, retry_after_s=2)
    if isinstance(exc, AgentConflict) and exc.code == ErrorCode.NETWORK_NOT_ATTACHED:
        return Conflict(exc.message, code=ErrorCode.NETWORK_NOT_ATTACHED)
    if isinstance(exc, AgentInvalid):
        return InvalidRequest(str(exc.details.get("field", "network")), exc.message)
    return BadGateway(exc.message, code=exc.code)


__all__ = ["agent_failure", "checked", "network_text", "policy_of"]
