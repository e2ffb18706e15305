"""The runtime interface: how a host starts, inspects and stops a sandbox. Deliberately small."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from corral.codes import ErrorCode
from corral.core.types import DEFAULT_CPUS, DEFAULT_SANDBOX_PIDS, DEFAULT_TEMPLATE
from corral.exec_result import ExecResult
from corral.runtime.stream import PtySize, Spawned

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
    # The network namespace to join (a path: the agent's network slot, see corral.agent.netslots),
    # whose interface and host-side filters the sandbox cannot touch; None: as ``network`` says.
    netns: str | None = None
    # Its one nameserver (the slot's resolver, see corral.agent.dns), written as its /etc/resolv.conf
    # in place of the host's; None: the host's resolv.conf when it has the network.
    nameserver: str | None = None
    pids: int = DEFAULT_PIDS
    epoch: int = 0  # which owner of this id this copy is (kept on disk: it is no secret)
    # The image its root is made of (a digest, see corral.images); None: the host's own system
    # directories, read-only, as before images. ``disk_mb`` sizes its own writable disk over it.
    image: str | None = None
    disk_mb: int | None = None
    user: str | None = None  # who its commands run as by default (the image's config); None: "user"
    workdir: str | None = None  # where they start; None: the user's home
    leased: bool = False  # runs only while its host holds a run lease (recreate-policy)


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


class Unsupported(RuntimeFailure):
    """This runtime cannot do what was asked (a feature another runtime has); nothing was done."""

    code = ErrorCode.UNSUPPORTED_OPTION


class SandboxExists(RuntimeFailure):
    """A sandbox with this id is already on this host; the existing one is untouched."""

    code = ErrorCode.NAME_CONFLICT


def check_timeout(timeout_s: float) -> None:
    """A command's timeout is a positive number of seconds (so written that NaN fails too)."""
    if not timeout_s > 0:
        raise InvalidSandbox(f"timeout_s must be positive, got {timeout_s}", "timeout_s")


def shell_exit_code(returncode: int) -> int:
    """A host process's return code as a shell reports it: killed by signal N -> 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


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
        user: str | None = None,
        pty: PtySize | None = None,
    ) -> Spawned:
        """Start a command as the sandbox user (or ``user``: ``root``, in a sandbox of an image, where
        root inside is an unprivileged uid outside), in the sandbox, and hand it back while it runs;
        on a terminal of ``pty``'s size if asked (:class:`Unsupported` where the runtime has none)."""
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

    async def disk_used_mb(self, sandbox_id: str) -> int | None:
        """What its own writable disk holds (MiB); None when it has none (no image) or it cannot be read."""
        return None

    async def list(self) -> list[SandboxHandle]:
        """What is running now; an agent restarted while sandboxes run re-adopts these."""
        ...


@runtime_checkable
class Reboots(Protocol):
    """A runtime that can end every process of a sandbox but its init and keep its files: what a
    pause without memory and a resume as a reboot are made of."""

    name: str

    async def reboot(self, sandbox_id: str) -> None: ...


@runtime_checkable
class KeepsDisks(Protocol):
    """A runtime that keeps sandboxes' disks ready (mounted) on the host: a process that shuts down
    removes them, since nothing else would until the next runtime over the same root starts."""

    name: str

    async def drain_disks(self) -> None: ...


@runtime_checkable
class GuestFiles(Protocol):
    """A runtime whose sandboxes hold corral's launcher where their user may run it: the data plane's
    file operations then run as its ``fs`` mode (see corral/runtime/launcher.c), needing nothing of
    the sandbox's own (no python3)."""

    name: str

    async def guest_program(self, sandbox_id: str) -> str | None:
        """The launcher's path inside the sandbox, or None when none there serves the fs mode (or the
        sandbox is gone)."""
        ...
