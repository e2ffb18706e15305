"""The host agent: runs sandboxes, measures them, publishes what its host can still admit, and refuses
fast and retryably when it must. The HTTP app and the CLI command live in ``corral.agent.http`` and
``corral.agent.cli``."""

from corral.agent.agent import Agent
from corral.agent.client import AgentClient, HttpAgentClient, LocalAgentClient
from corral.agent.config import AgentConfig
from corral.agent.errors import (
    AgentConflict,
    AgentError,
    AgentInvalid,
    AgentRefusal,
    AgentRuntimeError,
    AgentSandboxNotFound,
    AgentUnauthorized,
    AgentUnavailable,
)
from corral.agent.limiter import StartsLimiter, StartsSaturated
from corral.agent.metrics import AgentCollector
from corral.agent.pressure import PressureSignal, host_signal, psi_signal, usage_ratio_signal
from corral.agent.protocol import (
    AgentHeartbeat,
    Capacity,
    ExecRequest,
    SandboxInfo,
    StartSandbox,
)
from corral.agent.sinks import HeartbeatRejected, HeartbeatSink, HttpHeartbeatSink, http_heartbeat_sink
from corral.exec_result import ExecResult

__all__ = [
    "Agent",
    "AgentClient",
    "AgentCollector",
    "AgentConfig",
    "AgentConflict",
    "AgentError",
    "AgentHeartbeat",
    "AgentInvalid",
    "AgentRefusal",
    "AgentRuntimeError",
    "AgentSandboxNotFound",
    "AgentUnauthorized",
    "AgentUnavailable",
    "Capacity",
    "ExecRequest",
    "ExecResult",
    "HeartbeatRejected",
    "HeartbeatSink",
    "HttpAgentClient",
    "HttpHeartbeatSink",
    "LocalAgentClient",
    "PressureSignal",
    "SandboxInfo",
    "StartSandbox",
    "StartsLimiter",
    "StartsSaturated",
    "host_signal",
    "http_heartbeat_sink",
    "psi_signal",
    "usage_ratio_signal",
]
