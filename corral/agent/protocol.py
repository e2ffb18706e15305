"""The agent's wire models (pydantic v2): what it publishes, and what it is asked to do.

The control plane reads ``Heartbeat`` through ``POST /v1/agent/heartbeat``; ``memory_mb_admittable`` in it
is the agent's own verdict, computed with :func:`corral.core.admission.admittable_mb`. Host state
(ready / draining) is deliberately absent: draining is the control plane's decision, not the host's.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from corral.core.types import MAX_SANDBOX_PIDS, MIN_SANDBOX_PIDS, AdmissionMode, HostState, HostView

# Sandbox ids and hostnames travel in URLs and become hostnames: keep them to a safe alphabet.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
HOSTNAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$"
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB: anything larger is a typo, not a sandbox
MAX_CPUS = 1024.0
MAX_EXEC_TIMEOUT_S = 3600.0
MAX_ENV = 256
MAX_HEARTBEAT_SANDBOXES = 65_536


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Lenient(BaseModel):
    # What the agent publishes: a newer agent may add fields an older control plane ignores.
    model_config = ConfigDict(extra="ignore", frozen=True)


class StartSandbox(_Model):
    id: str = Field(pattern=ID_PATTERN)
    memory_mb: int = Field(gt=0, le=MAX_MEMORY_MB, strict=True)
    cpus: float = Field(default=1.0, gt=0, le=MAX_CPUS)
    stateful: bool = Field(default=False, strict=True)
    template: str | None = Field(default=None, min_length=1, max_length=128)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV)
    hostname: str | None = Field(default=None, pattern=HOSTNAME_PATTERN)
    network: bool = Field(default=False, strict=True)  # loopback only unless asked
    # Its pids limit; None: the runtime's default.
    pids: int | None = Field(default=None, ge=MIN_SANDBOX_PIDS, le=MAX_SANDBOX_PIDS, strict=True)


class SandboxInfo(_Lenient):
    id: str
    memory_mb: int
    cpus: float
    stateful: bool
    template: str | None
    hostname: str
    started_at: float
    # Last measurement that counts (taken after the sandbox settled); None means it is charged its reserve.
    resident_mb: int | None = None
    # What the local gate charges for it right now, in the agent's admission mode.
    charged_mb: int
    oom_kills: int = 0
    paused: bool = False  # frozen in place: nothing runs until it is resumed


class ExecRequest(_Model):
    command: list[str] = Field(min_length=1, max_length=4096)
    timeout_s: float = Field(default=30.0, gt=0, le=MAX_EXEC_TIMEOUT_S)
    env: dict[str, str] = Field(default_factory=dict, max_length=MAX_ENV)
    cwd: str | None = Field(default=None, pattern=r"^/", max_length=4096)


class ExecResponse(_Lenient):
    exit_code: int
    stdout: str
    stderr: str
    duration_ms: float
    truncated: bool = False
    timed_out: bool = False


class Capacity(_Lenient):
    """What a host can take, as a heartbeat carries it (and ``GET /v1/capacity`` answers on demand)."""

    cpu_total: float
    cpu_used: float
    memory_mb_total: int
    memory_mb_used: int
    memory_admission: AdmissionMode
    memory_mb_admittable: int
    templates: list[str] | None = None  # None: any template
    runtime: str
    gpu: str | None = None
    role: str = "worker"
    stream_restore: bool = False
    # Informational: the control plane's filters do not need them, operators do.
    intake_open: bool = True
    starts_in_flight: int = 0
    max_concurrent_starts: int = 0


class Heartbeat(Capacity):
    agent_id: str
    # Strictly increasing per agent, and seeded from the clock so it keeps increasing across restarts:
    # a receiver may drop any heartbeat whose seq is not above the last one it kept.
    seq: int = Field(ge=1)
    address: str
    sent_at: float
    sandbox_ids: list[str] = Field(default_factory=list)
    # Sandbox id -> processes the kernel's OOM killer has killed in it so far; only nonzero counts.
    oom_kills: dict[Annotated[str, Field(pattern=ID_PATTERN)], Annotated[int, Field(ge=0, lt=2**63)]] = Field(
        default_factory=dict, max_length=MAX_HEARTBEAT_SANDBOXES
    )

    def host_view(self, heartbeat_at: float | None = None, state: HostState = HostState.READY) -> HostView:
        """The core's view of this host. ``heartbeat_at`` is when the receiver got it (default: sent_at);
        ``state`` is the control plane's own (draining is its decision, never the agent's)."""
        return HostView(
            id=self.agent_id,
            heartbeat_at=self.sent_at if heartbeat_at is None else heartbeat_at,
            cpu_total=self.cpu_total,
            cpu_used=self.cpu_used,
            memory_mb_total=self.memory_mb_total,
            memory_mb_used=self.memory_mb_used,
            memory_mb_admittable=self.memory_mb_admittable,
            memory_admission=self.memory_admission,
            templates=None if self.templates is None else frozenset(self.templates),
            runtime=self.runtime,
            gpu=self.gpu,
            role=self.role,
            state=state,
            stream_restore=self.stream_restore,
        )
