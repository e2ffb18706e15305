"""corral's Python SDK: ``Corral`` (blocking) and ``AsyncCorral`` (asyncio).

It imports nothing of the server. Creates retry "not now" refusals with full-jitter backoff under one
idempotency key and raise ``CapacityUnavailable`` at the deadline: transient, so park the work as
``waiting_capacity`` and never write it to a status column as a failure.
"""

from corral.client.async_client import (
    AsyncCommandHandle,
    AsyncCommands,
    AsyncCorral,
    AsyncHosts,
    AsyncPools,
    AsyncSandbox,
    AsyncSandboxes,
    AsyncTokens,
)
from corral.client.client import CommandHandle, Commands, Corral, Hosts, Pools, Sandbox, Sandboxes, Tokens
from corral.client.errors import (
    CapacityUnavailable,
    CorralError,
    Forbidden,
    HostBusy,
    InvalidRequest,
    Misdirected,
    NameConflict,
    NotFound,
    OverQuota,
    PayloadTooLarge,
    RateLimited,
    SandboxOrphaned,
    SandboxPaused,
    TenantBusy,
    TooManyConcurrent,
    Unauthorized,
    Unreachable,
)
from corral.client.models import CommandInfo, CommandOutput, Host, SandboxRecord
from corral.client.retry import CreateStats, RetryBudget, RetryPolicy
from corral.client.sandbox import SandboxView
from corral.exec_result import ExecResult

__all__ = [
    "AsyncCommandHandle",
    "AsyncCommands",
    "AsyncCorral",
    "AsyncHosts",
    "AsyncPools",
    "AsyncSandbox",
    "AsyncSandboxes",
    "AsyncTokens",
    "CapacityUnavailable",
    "CommandHandle",
    "CommandInfo",
    "CommandOutput",
    "Commands",
    "Corral",
    "CorralError",
    "CreateStats",
    "ExecResult",
    "Forbidden",
    "Host",
    "HostBusy",
    "Hosts",
    "InvalidRequest",
    "Misdirected",
    "NameConflict",
    "NotFound",
    "OverQuota",
    "PayloadTooLarge",
    "Pools",
    "RateLimited",
    "RetryBudget",
    "RetryPolicy",
    "Sandbox",
    "SandboxOrphaned",
    "SandboxPaused",
    "SandboxRecord",
    "SandboxView",
    "Sandboxes",
    "TenantBusy",
    "Tokens",
    "TooManyConcurrent",
    "Unauthorized",
    "Unreachable",
]
