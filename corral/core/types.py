"""The values the policy core reasons about: a host as last observed, and a create request."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum

# Processes (threads included) one sandbox may run at once, by default: enough for a build or a test
# suite, far below what would exhaust a host's pid space. Below the minimum the sandbox's own skeleton
# (reaper, init, a shell) could not run; the maximum is the kernel's pid_max ceiling.
DEFAULT_SANDBOX_PIDS = 512
MIN_SANDBOX_PIDS = 8
MAX_SANDBOX_PIDS = 1 << 22
# What a sandbox that names no template, or whose start names no CPU share, runs with: declared once
# for every hop of its shape on the way down (the create's spec, the request placement weighs, the
# runtime's spec). A create that leaves ``cpus`` out takes its template's, not this.
DEFAULT_TEMPLATE = "default"
DEFAULT_CPUS = 1.0
# A sandbox's own disk (the writable layer over its image), in MiB: below the minimum an ext4 disk
# holds little more than its own journal; above the maximum it is a typo, not a sandbox.
DEFAULT_SANDBOX_DISK_MB = 1024
MIN_SANDBOX_DISK_MB = 16
MAX_SANDBOX_DISK_MB = 1024 * 1024


class AdmissionMode(StrEnum):
    """How a host charges memory: promises (committed) or measurements (working-set)."""

    COMMITTED = "committed"
    WORKING_SET = "working-set"


class HostState(StrEnum):
    READY = "ready"
    DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class HostFacts:
    """What a host's agent says of it in every heartbeat. Declared here once: the placement view, the
    store's host record and the agent's wire model all carry exactly these.

    ``memory_mb_admittable`` is the agent's own verdict, computed with
    :func:`corral.core.admission.admittable_mb`; the scheduler subtracts only the reservations the
    agent cannot know about yet.
    """

    cpu_total: float
    cpu_used: float
    memory_mb_total: int
    memory_mb_used: int
    memory_mb_admittable: int
    memory_admission: AdmissionMode = AdmissionMode.WORKING_SET
    # None: the host accepts any template (templates need no local artefact there).
    templates: frozenset[str] | None = None
    runtime: str = "sim"
    gpu: str | None = None
    role: str = "worker"
    stream_restore: bool = False
    # The images (digests) on the host's own disk: a create of one of them starts without a fetch.
    images: frozenset[str] = frozenset()

    def facts(self) -> HostFacts:
        """Only the facts (a subclass's extra fields dropped)."""
        return HostFacts(**{f: getattr(self, f) for f in HOST_FACTS})


HOST_FACTS: tuple[str, ...] = tuple(f.name for f in fields(HostFacts))


@dataclass(frozen=True, slots=True, kw_only=True)
class HostView(HostFacts):
    """A host as its last heartbeat described it, with the control plane's own word on it (``state``:
    draining is its decision, never the agent's). Positive facts only; never mutated in place."""

    id: str
    heartbeat_at: float
    state: HostState = HostState.READY


@dataclass(frozen=True, slots=True)
class CreateRequest:
    """What one sandbox asks of a host."""

    memory_mb: int
    cpu: float = DEFAULT_CPUS
    stateful: bool = False
    template: str | None = None
    runtime: str | None = None
    gpu: str | None = None
    tenant: str | None = None
    # The image its root is made of (a digest): a host that holds it starts it without a fetch.
    image: str | None = None

    def __post_init__(self) -> None:
        if self.memory_mb <= 0:
            raise ValueError("memory_mb must be positive")
        if self.cpu < 0:
            raise ValueError("cpu must not be negative")


@dataclass(frozen=True, slots=True)
class SandboxUsage:
    """One live sandbox as its host accounts for it.

    ``resident_mb`` is None until a measurement has seen the sandbox: until then working-set
    admission charges it the reserve, not zero (between admission and the first measurement the host
    cannot see what the sandbox uses, and a burst admitted against zero would overfill it).
    """

    memory_mb: int
    resident_mb: int | None = None
    stateful: bool = False


@dataclass(frozen=True, slots=True)
class Pending:
    """Outstanding reserved capacity on one host."""

    memory_mb: int = 0
    cpu: float = 0.0


NO_PENDING = Pending()


@dataclass(frozen=True, slots=True)
class FleetView:
    """A read-only snapshot of the fleet, indexable for O(1) random sampling."""

    hosts: tuple[HostView, ...]
    read_at: float
    by_id: dict[str, HostView] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_id", {h.id: h for h in self.hosts})

    def __len__(self) -> int:
        return len(self.hosts)
