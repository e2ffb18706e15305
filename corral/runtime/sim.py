"""The ``sim`` runtime: sandboxes without processes, for demos, tests and fleet-scale benchmarks.

Resident memory follows the touch model the simulator uses (:class:`corral.core.touch.TouchModel`), as
a pure function of age on the injected clock. ``exec`` answers honestly for the few commands it can
emulate and says plainly that it is a simulation for anything else: a sim sandbox must never pass for a
real one.

The sandboxes live in a :class:`SimState`, which may outlive the runtime (and the agent) that created it,
so a test can restart an agent over the same "host" and watch it re-adopt what still runs. A state given
the host's physical memory has a kernel: whenever its sandboxes together hold more than that, the OOM
killer kills the largest one's workload (counted in that sandbox's ``oom_kills``, as a cgroup's
``memory.events`` counts kills by any OOM killer), and the host's memory in use is readable as a real
host's is, for the agent's pressure gate.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

from corral.clock import SystemClock
from corral.core.clock import Clock
from corral.core.settle import DEFAULT_SETTLE_S
from corral.core.touch import TouchModel, TouchProfile
from corral.exec_result import ExecResult
from corral.runtime.base import (
    RuntimeFailure,
    SandboxHandle,
    SandboxNotFound,
    SandboxPaused,
    SandboxSpec,
    Unsupported,
)
from corral.runtime.stream import PtySize, Spawned, finished

Sleep = Callable[[float], Awaitable[None]]

NOT_EMULATED = 127
TIMED_OUT = 124  # what coreutils' timeout(1) answers


@dataclass(slots=True)
class SimSandbox:
    handle: SandboxHandle
    profile: TouchProfile
    oom_kills: int = 0
    # When the OOM killer last killed its workload: what that held is freed and does not come back by
    # itself; the sandbox lives on at its base (its init and agent-side helpers).
    killed_at: float | None = None

    @property
    def hostname(self) -> str:
        return self.handle.spec.hostname or self.handle.id

    def resident_mb(self, now: float) -> int:
        if self.killed_at is not None:
            return min(self.profile.limit_mb, self.profile.base_mb)
        return self.profile.resident_mb(now - self.handle.started_at)


@dataclass(slots=True)
class SimState:
    """The simulated host's memory of what runs on it; survives a restart of the agent.

    ``memory_mb``: the host's physical memory (None: unbounded, and no OOM killer)."""

    sandboxes: dict[str, SimSandbox] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    started_total: int = 0
    stopped_total: int = 0
    memory_mb: int | None = None
    oom_kills_total: int = 0
    _reclaimed_at: float | None = field(default=None, repr=False)

    def resident_mb_total(self, now: float) -> int:
        return sum(s.resident_mb(now) for s in self.sandboxes.values())

    def reclaim(self, now: float) -> list[str]:
        """The kernel at ``now``: while the sandboxes hold more than the host has, kill the workload of
        the one holding the most (ties: the greatest id). Returns the ids whose workload was killed."""
        if self.memory_mb is None or now == self._reclaimed_at:
            return []
        self._reclaimed_at = now
        resident = {sid: s.resident_mb(now) for sid, s in self.sandboxes.items()}
        used = sum(resident.values())
        killed: list[str] = []
        while used > self.memory_mb and resident:
            victim = max(resident, key=lambda sid: (resident[sid], sid))
            s = self.sandboxes[victim]
            s.killed_at = now
            s.oom_kills += 1
            self.oom_kills_total += 1
            used += s.resident_mb(now) - resident.pop(victim)
            killed.append(victim)
        return killed

    def used_ratio(self, now: float) -> float | None:
        """Physical memory in use as a fraction of the host's (None: the host has no bound)."""
        if self.memory_mb is None:
            return None
        self.reclaim(now)
        return self.resident_mb_total(now) / self.memory_mb

    async def run_kernel(self, clock: Clock, tick_s: float, sleep: Sleep = asyncio.sleep) -> None:
        """Look at physical memory every ``tick_s`` until cancelled, as the kernel does continually:
        memory that grows between two readings is reclaimed when it grows, not when next read."""
        while True:
            self.reclaim(clock.now())
            await sleep(tick_s)


class SimRuntime:
    """A :class:`corral.runtime.base.Runtime` with no processes.

    ``clock`` ages the sandboxes, ``rng`` draws each one's touch profile, ``sleep`` is how ``sleep N``
    and ``start_latency_s`` pass time (inject one that advances a manual clock in tests).
    """

    name = "sim"
    # A modelled guest faults its working set in over seconds (the touch model's ramp): a reading
    # before then understates what the sandbox will hold.
    memory_settle_s = DEFAULT_SETTLE_S
    # A reading is a pure function of age that flattens once the ramp is over: reading every settled
    # sandbox at every heartbeat would cost a fleet-scale benchmark O(sandboxes) per beat for nothing.
    settled_readings_per_beat = 256

    def __init__(
        self,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        model: TouchModel | None = None,
        state: SimState | None = None,
        *,
        sleep: Sleep | None = None,
        start_latency_s: float = 0.0,
        memory_mb: int | None = None,
    ) -> None:
        if start_latency_s < 0:
            raise ValueError("start_latency_s must not be negative")
        if memory_mb is not None and memory_mb <= 0:
            raise ValueError("memory_mb must be positive")
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.model = model or TouchModel()
        self.state = state if state is not None else SimState()
        if memory_mb is not None:
            self.state.memory_mb = memory_mb
        self._sleep: Sleep = sleep or asyncio.sleep
        self.start_latency_s = start_latency_s

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        if spec.memory_mb <= 0:
            raise RuntimeFailure(f"sandbox {spec.id!r}: memory_mb must be positive")
        if spec.id in self.state.sandboxes:
            raise RuntimeFailure(f"sandbox {spec.id!r} already exists")
        if self.start_latency_s:
            await self._sleep(self.start_latency_s)
            if spec.id in self.state.sandboxes:  # raced with a start of the same id
                raise RuntimeFailure(f"sandbox {spec.id!r} already exists")
        now = self.clock.now()
        self.state.reclaim(now)  # what ran before this start is judged without it
        handle = SandboxHandle(id=spec.id, spec=spec, started_at=now, ref=f"sim:{spec.id}")
        self.state.sandboxes[spec.id] = SimSandbox(handle, self.model.profile(spec.memory_mb, self.rng))
        self.state.started_total += 1
        return handle

    async def stop(self, sandbox_id: str) -> None:
        if self.state.sandboxes.pop(sandbox_id, None) is None:
            raise SandboxNotFound(sandbox_id)
        self.state.paused.discard(sandbox_id)
        self.state.stopped_total += 1

    async def list(self) -> list[SandboxHandle]:
        return [s.handle for s in self.state.sandboxes.values()]

    async def resident_mb(self, sandbox_id: str) -> int | None:
        now = self.clock.now()
        self.state.reclaim(now)
        return self._get(sandbox_id).resident_mb(now)

    async def disk_used_mb(self, sandbox_id: str) -> int | None:
        return None  # a simulated sandbox has no disk of its own

    async def oom_kills(self, sandbox_id: str) -> int:
        """Kills by the host's OOM killer (its own limit is never overrun: the model stops at it)."""
        self.state.reclaim(self.clock.now())
        return self._get(sandbox_id).oom_kills

    def memory_used_ratio(self) -> float | None:
        """The host's memory in use, as ``/proc/meminfo`` would give it (None: unbounded host)."""
        return self.state.used_ratio(self.clock.now())

    # -- exec -----------------------------------------------------------------------------------

    async def exec(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        s = self._get(sandbox_id)
        if sandbox_id in self.state.paused:
            raise SandboxPaused(f"sandbox {sandbox_id!r} is paused")
        began = self.clock.now()
        argv = list(command)
        if not argv:
            return ExecResult(exit_code=NOT_EMULATED, stderr="sim runtime: empty command\n")
        full_env = {**s.handle.spec.env, **(env or {})}
        prog, args = argv[0].rsplit("/", 1)[-1], argv[1:]
        if prog == "sleep":
            return await self._exec_sleep(args, timeout_s, began)
        code, out, err = _emulate(prog, args, s, full_env, cwd)
        return ExecResult(
            exit_code=code, stdout=out, stderr=err, duration_ms=(self.clock.now() - began) * 1000.0
        )

    async def _exec_sleep(self, args: Sequence[str], timeout_s: float, began: float) -> ExecResult:
        try:
            seconds = sum(float(a) for a in args) if args else -1.0
        except ValueError:
            seconds = -1.0
        if seconds < 0:
            return ExecResult(exit_code=1, stderr=f"sleep: invalid time interval {' '.join(args)!r}\n")
        timed_out = seconds > timeout_s
        await self._sleep(min(seconds, timeout_s))
        elapsed_ms = (self.clock.now() - began) * 1000.0
        if timed_out:
            return ExecResult(
                exit_code=TIMED_OUT,
                stderr=f"sleep: timed out after {timeout_s:g}s\n",
                duration_ms=elapsed_ms,
                timed_out=True,
            )
        return ExecResult(exit_code=0, duration_ms=elapsed_ms)

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
        """The emulated command, already over: a simulation has no process to watch."""
        if pty is not None:
            raise Unsupported("the simulated runtime has no terminals")
        r = await self.exec(sandbox_id, command, env=env, cwd=cwd)
        return finished(r.exit_code, r.stdout.encode(), r.stderr.encode())

    # -- pause ----------------------------------------------------------------------------------

    def paused(self, sandbox_id: str) -> bool:
        self._get(sandbox_id)
        return sandbox_id in self.state.paused

    async def pause(self, sandbox_id: str) -> None:
        self._get(sandbox_id)
        self.state.paused.add(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        self._get(sandbox_id)
        self.state.paused.discard(sandbox_id)

    def _get(self, sandbox_id: str) -> SimSandbox:
        s = self.state.sandboxes.get(sandbox_id)
        if s is None:
            raise SandboxNotFound(sandbox_id)
        return s


def _emulate(
    prog: str, args: list[str], s: SimSandbox, env: Mapping[str, str], cwd: str | None
) -> tuple[int, str, str]:
    """The commands a sandbox with no processes can still answer truthfully."""
    if prog == "true":
        return 0, "", ""
    if prog == "false":
        return 1, "", ""
    if prog == "echo":
        newline = True
        if args and args[0] == "-n":
            newline, args = False, args[1:]
        return 0, " ".join(args) + ("\n" if newline else ""), ""
    if prog == "hostname" and not args:
        return 0, s.hostname + "\n", ""
    if prog == "env" and not args:
        return 0, "".join(f"{k}={v}\n" for k, v in sorted({**env, "HOSTNAME": s.hostname}.items())), ""
    if prog == "pwd" and not args:
        return 0, (cwd or "/") + "\n", ""
    if prog == "cat" and args:
        out: list[str] = []
        for path in args:
            if path != "/etc/hostname":
                return (
                    1,
                    "".join(out),
                    f"cat: {path}: No such file or directory (sim runtime: only /etc/hostname exists)\n",
                )
            out.append(s.hostname + "\n")
        return 0, "".join(out), ""
    shown = " ".join([prog, *args])
    return (
        NOT_EMULATED,
        "",
        f"corral sim runtime: {shown!r} is not emulated; this sandbox is a simulation and runs no processes\n",
    )
