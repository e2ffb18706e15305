"""The ``sim`` runtime: sandboxes without processes, for demos, tests and fleet-scale benchmarks.

Resident memory follows the touch model the simulator uses (:class:`corral.core.touch.TouchModel`), as
a pure function of age on the injected clock. ``exec`` answers honestly for the few commands it can
emulate and says plainly that it is a simulation for anything else: a sim sandbox must never pass for a
real one.

The sandboxes live in a :class:`SimState`, which may outlive the runtime (and the agent) that created it,
so a test can restart an agent over the same "host" and watch it re-adopt what still runs.
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
)
from corral.runtime.stream import Spawned, finished

Sleep = Callable[[float], Awaitable[None]]

NOT_EMULATED = 127
TIMED_OUT = 124  # what coreutils' timeout(1) answers


@dataclass(slots=True)
class SimSandbox:
    handle: SandboxHandle
    profile: TouchProfile

    @property
    def hostname(self) -> str:
        return self.handle.spec.hostname or self.handle.id


@dataclass(slots=True)
class SimState:
    """The simulated host's memory of what runs on it; survives a restart of the agent."""

    sandboxes: dict[str, SimSandbox] = field(default_factory=dict)
    paused: set[str] = field(default_factory=set)
    started_total: int = 0
    stopped_total: int = 0

    def resident_mb_total(self, now: float) -> int:
        return sum(s.profile.resident_mb(now - s.handle.started_at) for s in self.sandboxes.values())


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
    ) -> None:
        if start_latency_s < 0:
            raise ValueError("start_latency_s must not be negative")
        self.clock: Clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.model = model or TouchModel()
        self.state = state if state is not None else SimState()
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
        handle = SandboxHandle(id=spec.id, spec=spec, started_at=self.clock.now(), ref=f"sim:{spec.id}")
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
        s = self._get(sandbox_id)
        return s.profile.resident_mb(self.clock.now() - s.handle.started_at)

    async def oom_kills(self, sandbox_id: str) -> int:
        self._get(sandbox_id)  # the model never overruns a limit: no kernel to kill anything
        return 0

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
    ) -> Spawned:
        """The emulated command, already over: a simulation has no process to watch."""
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
