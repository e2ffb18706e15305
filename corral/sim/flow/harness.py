"""What a run of corral's real control plane on virtual time is built from: replicas built by
:func:`~corral.control.plane.build_replica` (the server's own wiring) over a guarded store, a real
agent on the ``sim`` runtime, and a run on the virtual-time loop with ids drawn from a seed. The
deterministic simulation with faults and the fleet experiments both build on these, so both drive the
same code the server runs: its create flow, parked creates, warm pools, heartbeat intake, reconciler.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from corral import ids
from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.pressure import sim_signal
from corral.agent.sinks import HeartbeatSink
from corral.client.errors import CorralError, Unreachable
from corral.codes import ErrorCode
from corral.control.errors import ControlError
from corral.core.clock import Clock
from corral.core.touch import TouchModel
from corral.core.types import AdmissionMode
from corral.runtime.sim import SimRuntime, SimState
from corral.sim.flow.vtime import run_virtual
from corral.store import StoreError

START = 1_000_000.0  # virtual epoch seconds: far from 0, where a never-heard-from host sits


def sim_agent(
    host_id: str,
    clock: Clock,
    rng: random.Random,
    state: SimState,
    *,
    memory_mb: int,
    cpus: float,
    heartbeat_interval_s: float,
    sink: HeartbeatSink,
    starts_limit: int,
    start_latency_s: float,
    admission: AdmissionMode,
    touch: TouchModel | None = None,
    settle_s: float | None = None,
    pressure: tuple[float, float] | None = None,
) -> Agent:
    """The real agent over a simulated host's sandboxes (``state`` outlives the agent across a crash).
    A ``state`` with the host's physical memory feeds the agent's pressure gate from it, judged by
    ``pressure`` (close_at, open_at; None: the agent's usual band)."""
    runtime = SimRuntime(clock, rng, touch, state=state, start_latency_s=start_latency_s)
    signal = None
    if state.memory_mb is not None:
        signal = sim_signal(runtime.memory_used_ratio, *(pressure or ()))
    return Agent(
        AgentConfig(
            host_id,
            memory_mb,
            cpus,
            admission=admission,
            heartbeat_interval_s=heartbeat_interval_s,
            max_concurrent_starts=starts_limit,
            settle_s=settle_s,
        ),
        runtime,
        clock=clock,
        sink=sink,
        pressure=signal,
        lease_clock=clock.now,  # the run lease on virtual time too
    )


def run_seeded(main: Coroutine[Any, Any, Any], tag: str) -> Any:
    """Run ``main`` on a fresh virtual-time loop from :data:`START`, with every id drawn from ``tag``
    and corral's own logging quiet (a run is judged by what it returns, not by its log)."""
    ids.reseed(tag)
    quiet = logging.getLogger("corral")
    level, quiet.level = quiet.level, logging.CRITICAL
    try:
        return run_virtual(main, START)
    finally:
        quiet.level = level
        ids.reseed(None)


def client_error(exc: BaseException) -> BaseException:
    """An error a replica raised, as the SDK sees it through the API (the server's mapping)."""
    if isinstance(exc, ControlError):
        return CorralError(exc.message, code=exc.code, status=exc.status, retry_after_s=exc.retry_after_s)
    if isinstance(exc, StoreError):
        status = 503 if exc.code == ErrorCode.STORE_UNAVAILABLE else 500
        return CorralError(str(exc), code=exc.code, status=status, retry_after_s=1.0)
    return exc


class Process:
    """A replica's process: the tasks it runs, and whether it still lives."""

    def __init__(self) -> None:
        self.alive = True
        # In the order they were spawned: a crash cancels them in that order whatever their ids, so
        # a run does not depend on where in memory its tasks happened to live.
        self.tasks: dict[asyncio.Task[Any], None] = {}

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks[task] = None
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.pop(task, None)

    def crash(self) -> None:
        """The process dies: whatever it was doing stops at its current await, and nothing it would
        have done to clean up reaches the store or the agents."""
        self.alive = False
        for task in list(self.tasks):
            task.cancel()


class Guarded:
    """The store as one process reaches it: once the process is gone, nothing more of it reaches the
    store (a dead process's clean-up never runs); ``after`` sees every call's name and result."""

    def __init__(
        self, store: object, process: Process, after: Callable[[str, object], None] | None = None
    ) -> None:
        self._store = store
        self._process = process
        self._after = after

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        fn = getattr(self._store, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if not self._process.alive:
                raise StoreError("this process is gone")
            result = await fn(*args, **kwargs)
            if self._after is not None:
                self._after(name, result)
            return result

        return call


P = TypeVar("P", bound=Process)


async def request(process: P | None, make: Callable[[P], Coroutine[Any, Any, Any]]) -> Any:
    """One request through a load balancer to ``process``: a process that dies mid-request is a lost
    connection; what the replica raises reaches the caller as the SDK would see it."""
    if process is None:
        raise Unreachable("no replica answers")
    task = process.spawn(make(process))
    await asyncio.wait([task])
    if task.cancelled():
        raise Unreachable("the replica went away mid-request")
    exc = task.exception()
    if exc is not None:
        raise client_error(exc)
    return task.result()
