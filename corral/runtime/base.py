"""The runtime interface: how a host starts, inspects and stops a sandbox. Deliberately small."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from corral.codes import ErrorCode
from corral.core.types import DEFAULT_CPUS, DEFAULT_SANDBOX_PIDS, DEFAULT_TEMPLATE
from corral.exec_result import ExecResult
from corral.runtime.stream import Spawned

DEFAULT_PIDS = DEFAULT_SANDBOX_PIDS


@dataclass(frozen=True, slots=True)
class SandboxSpec:
    id: str
    memory_mb: int
    cpus: float = DEFAULT_CPUS
    template: str = DEFAULT_TEMPLATE
    stateful: bool = False
    hostname: str | None = None  # defaults to the sandbox id
    env: Mapping[str, str] = field(default_factory=dict)
    network: bool = False  # loopback only unless asked
    pids: int = DEFAULT_PIDS
    epoch: int = 0  # which owner of this id this copy is (kept on disk: it is no secret)


@dataclass(frozen=True, slots=True)
class SandboxHandle:
    id: str
    spec: SandboxSpec
    started_at: float
    # Runtime-specific locator (a pid, a cgroup path); opaque to callers.
    ref: str = ""


class RuntimeFailure(Exception):
    """A runtime could not do what was asked (start failed, sandbox gone)."""


class SandboxNotFound(RuntimeFailure):
    pass


class SandboxPaused(RuntimeFailure):
    """The sandbox is paused: nothing runs in it until it is resumed."""

    code = ErrorCode.SANDBOX_PAUSED


class InvalidSandbox(RuntimeFailure):
    """The spec or the command cannot be run as given (bad id, too little memory, an environment or
    command execve would refuse). Nothing was created or run. ``field`` names what was wrong."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, message: str, field: str = "body") -> None:
        super().__init__(message)
        self.field = field


class Runtime(Protocol):
    name: str

    async def start(self, spec: SandboxSpec) -> SandboxHandle: ...

    async def stop(self, sandbox_id: str) -> None: ...

    async def exec(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult: ...

    async def spawn(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> Spawned:
        """Start a command as the sandbox user, in the sandbox, and hand it back while it runs."""
        ...

    async def pause(self, sandbox_id: str) -> None:
        """Stop every process of the sandbox where it stands, keeping its memory, until ``resume``."""
        ...

    async def resume(self, sandbox_id: str) -> None: ...

    def paused(self, sandbox_id: str) -> bool: ...

    async def resident_mb(self, sandbox_id: str) -> int | None:
        """Measured resident memory (working set), or None when it cannot be measured yet."""
        ...

    async def oom_kills(self, sandbox_id: str) -> int:
        """Processes of the sandbox the kernel killed for overrunning its memory limit, so far."""
        ...

    async def list(self) -> list[SandboxHandle]:
        """What is running now; an agent restarted while sandboxes run re-adopts these."""
        ...
