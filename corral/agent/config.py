"""What an operator sets on a host's agent: the host's id and size, its bounds, its admission policy,
its heartbeat's pace and what the host advertises beyond its size. One frozen value, so the agent's
constructor takes it and the things it is wired to (runtime, clock, pressure, sink), nothing else."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from corral.core.admission import DEFAULT_POLICY, AdmissionPolicy
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX
from corral.core.types import AdmissionMode


@dataclass(frozen=True)
class AgentConfig:
    """``admission`` is the host's mode (stateful sandboxes are charged in full in either);
    ``settle_s`` is how old a sandbox must be before a stable measurement of it replaces its reserve
    (None: what the runtime declares as its ``memory_settle_s``)."""

    id: str
    # The host's size: what its sandboxes may be given, in all.
    memory_mb_total: int
    cpu_total: float
    admission: AdmissionMode = AdmissionMode.WORKING_SET
    policy: AdmissionPolicy = DEFAULT_POLICY
    max_concurrent_starts: int = 8
    start_wait_s: float = 0.15
    # Commands in flight per sandbox, through exec and the E2B data plane alike (see ``Agent.enter``).
    max_execs_per_sandbox: int = DEFAULT_EXECS_PER_SANDBOX
    heartbeat_interval_s: float = 2.0
    # For a guest, longer than it takes to touch its working set (the touch model ramps over ~5 s): a
    # measurement taken earlier reads low, the host looks emptier than it is, and a burst that outlasts
    # the settle piles onto whichever host was measured first.
    settle_s: float | None = None
    warm_starts_per_round: int = 2
    warm_fill_interval_s: float = 0.05
    # What the host advertises in its heartbeats besides its size.
    templates: Iterable[str] | None = None
    gpu: str | None = None
    role: str = "worker"
    stream_restore: bool = False
    address: str = ""

    def __post_init__(self) -> None:
        if self.memory_mb_total <= 0 or self.cpu_total <= 0:
            raise ValueError("memory_mb_total and cpu_total must be positive")
        if self.heartbeat_interval_s <= 0:
            raise ValueError("heartbeat_interval_s must be positive")
        if self.settle_s is not None and self.settle_s < 0:
            raise ValueError("settle_s must not be negative")
