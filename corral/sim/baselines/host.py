"""A simulated host agent: sandboxes whose resident memory follows the core's touch model, the same
admission arithmetic the real agent publishes and enforces, an optional starts limiter and pressure
gate, and physical memory that can be exceeded (each time it is, the kernel kills one sandbox: an OOM
event).

The agent publishes ``memory_mb_admittable`` computed by :func:`corral.core.admittable_mb` at every
heartbeat, with ``resident_mb=None`` for every sandbox not yet measured after settling. Between
heartbeats its own gate keeps the same number current by charging each admission with the core's
``request_charge_mb`` and crediting each exit with ``charge_mb``: the same rule, applied incrementally.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass, field

from corral.codes import ErrorCode
from corral.core import (
    CreateRequest,
    HostView,
    PressureGate,
    SandboxUsage,
    TouchModel,
    TouchProfile,
    admittable_mb,
    charge_mb,
    fits,
    request_charge_mb,
)
from corral.sim.scenario import HostSpec, fixed_profile


# eq=False: a sandbox is itself (kept and removed by identity), not the sum of its fields.
@dataclass(slots=True, eq=False)
class SimSandbox:
    id: int
    host_id: str
    memory_mb: int
    cpu: float
    stateful: bool
    admitted_at: float
    profile: TouchProfile
    measured_mb: int | None = None
    starting: bool = field(default=False, init=False)
    ends_at: float | None = field(default=None, init=False)

    def resident_mb(self, now: float) -> int:
        return self.profile.resident_mb(now - self.admitted_at)

    def usage(self) -> SandboxUsage:
        return SandboxUsage(self.memory_mb, self.measured_mb, self.stateful)


class SimHost:
    def __init__(self, id: str, spec: HostSpec, touch: TouchModel, rng: random.Random) -> None:
        self.id = id
        self.spec = spec
        self.touch = touch
        self.rng = rng
        self.sandboxes: dict[int, SimSandbox] = {}
        self.cpu_used = 0.0
        self.starts_in_flight = 0
        self.reachable = True
        self.gate = PressureGate(*spec.pressure) if spec.pressure else None
        self.oom_events = 0
        self.oom_killed: list[SimSandbox] = []
        self.admitted = 0
        self.last_view: HostView | None = None
        self._admittable = admittable_mb(spec.memory_mb, (), spec.mode, spec.policy)

    # -- what the agent publishes --------------------------------------------------------------

    def usages(self) -> Iterator[SandboxUsage]:
        return (s.usage() for s in self.sandboxes.values())

    @property
    def admittable(self) -> int:
        """The gate's current number (kept incrementally; equals ``recount()`` at all times)."""
        return self._admittable

    def recount(self) -> int:
        """Admittable memory from scratch with the core's arithmetic."""
        return admittable_mb(self.spec.memory_mb, self.usages(), self.spec.mode, self.spec.policy)

    def physical_mb(self, now: float) -> int:
        return sum(s.resident_mb(now) for s in self.sandboxes.values())

    def measure(self, now: float) -> None:
        """Measure every settled sandbox: from now on it is charged what it actually holds."""
        settle = self.spec.settle_s
        for s in self.sandboxes.values():
            if now - s.admitted_at >= settle:
                s.measured_mb = s.resident_mb(now)
        self._admittable = self.recount()

    def heartbeat(self, now: float) -> HostView:
        self.measure(now)
        view = HostView(
            id=self.id,
            heartbeat_at=now,
            cpu_total=self.spec.cpus,
            cpu_used=self.cpu_used,
            memory_mb_total=self.spec.memory_mb,
            memory_mb_used=self.physical_mb(now),
            memory_mb_admittable=self._admittable,
            memory_admission=self.spec.mode,
        )
        self.last_view = view
        return view

    def next_heartbeat_in(self) -> float:
        j = self.spec.heartbeat_jitter
        return self.spec.heartbeat_s * (1.0 + self.rng.uniform(-j, j))

    def start_duration(self) -> float:
        return self.spec.start_p50_s * math.exp(self.rng.gauss(0.0, self.spec.start_sigma))

    # -- what the agent does -------------------------------------------------------------------

    def refusal(self, req: CreateRequest) -> str | None:
        """The agent's own checks on a start, cheapest first; None means it will start it."""
        spec = self.spec
        if not self.reachable:
            return ErrorCode.HOST_UNREACHABLE
        if spec.starts_limit is not None and self.starts_in_flight >= spec.starts_limit:
            return ErrorCode.HOST_STARTS_SATURATED
        if self.gate is not None and not self.gate.is_open:
            return ErrorCode.HOST_MEMORY_PRESSURE
        if spec.gate and not fits(self._admittable, 0, req, spec.mode, spec.policy):
            return ErrorCode.HOST_DOES_NOT_FIT
        return None

    def admit(self, sandbox_id: int, req: CreateRequest, now: float) -> SimSandbox:
        """Start a sandbox (the caller has checked ``refusal``)."""
        profile = self.touch.profile(req.memory_mb, self.rng)
        s = SimSandbox(sandbox_id, self.id, req.memory_mb, req.cpu, req.stateful, now, profile)
        s.starting = True
        self.sandboxes[sandbox_id] = s
        self.cpu_used += req.cpu
        self.starts_in_flight += 1
        self.admitted += 1
        self._admittable -= request_charge_mb(req, self.spec.mode, self.spec.policy)
        return s

    def preload(self, sandbox_id: int, memory_mb: int, resident_mb: int, cpu: float, now: float) -> None:
        """A sandbox already running and measured before the simulation starts."""
        profile = fixed_profile(memory_mb, resident_mb)
        s = SimSandbox(sandbox_id, self.id, memory_mb, cpu, False, now - self.spec.settle_s, profile)
        s.measured_mb = profile.resident_mb(self.spec.settle_s)
        self.sandboxes[sandbox_id] = s
        self.cpu_used += cpu
        self._admittable = self.recount()

    def started(self, s: SimSandbox) -> None:
        if s.starting:
            s.starting = False
            self.starts_in_flight -= 1

    def remove(self, sandbox_id: int) -> SimSandbox | None:
        s = self.sandboxes.pop(sandbox_id, None)
        if s is None:
            return None
        self.started(s)
        self.cpu_used -= s.cpu
        if not self.sandboxes:
            self.cpu_used = 0.0  # no float residue on an empty host
        spec = self.spec
        self._admittable += charge_mb(s.memory_mb, s.stateful, spec.mode, s.measured_mb, spec.policy)
        return s

    def memory_tick(self, now: float) -> list[SimSandbox]:
        """Check physical memory: feed the pressure gate, and OOM-kill while memory is exceeded.

        The kernel kills the sandbox holding the most memory, whichever tenant that is: the outcome a
        policy exists to avoid, so it is counted, never hidden.
        """
        total = self.spec.memory_mb
        resident = {sid: s.resident_mb(now) for sid, s in self.sandboxes.items()}
        used = sum(resident.values())
        killed: list[SimSandbox] = []
        while used > total and resident:
            victim = max(resident, key=lambda sid: (resident[sid], sid))
            used -= resident.pop(victim)
            s = self.remove(victim)
            if s is not None:
                killed.append(s)
                self.oom_events += 1
        if self.gate is not None:
            self.gate.observe(used / total)
        self.oom_killed.extend(killed)
        return killed
