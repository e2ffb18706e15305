"""The hosts of ``corral serve``: agents in this process, reached directly through the same agent
interface a remote host is reached through, heartbeating straight into the control plane."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from dataclasses import dataclass, field
from pathlib import Path

from corral.agent.agent import Agent
from corral.agent.client import LocalAgentClient
from corral.agent.config import AgentConfig
from corral.agent.metrics import AgentCollector
from corral.agent.protocol import AgentHeartbeat, HeartbeatReply
from corral.control.agents import LocalAgents
from corral.control.plane import ControlPlane
from corral.core import AdmissionMode, AdmissionPolicy, Clock
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX
from corral.runtime.base import Runtime


def process_runtime_available() -> bool:
    try:
        from corral.runtime.process import available
    except ImportError:
        return False
    return bool(available())


def build_runtime(kind: str, host_id: str, clock: Clock, seed: int, state_root: Path) -> Runtime:
    if kind == "sim":
        from corral.runtime.sim import SimRuntime

        return SimRuntime(clock, random.Random(seed))
    if kind == "process":
        from corral.runtime.process import ProcessRuntime

        # One state directory per host, so each agent re-adopts only its own sandboxes.
        runtime: Runtime = ProcessRuntime(root=state_root / host_id, cgroup_prefix=f"{host_id}-")
        return runtime
    raise ValueError(f"unknown runtime {kind!r}")


@dataclass
class LocalFleet:
    agents: list[Agent]
    directory: LocalAgents
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        for i, agent in enumerate(self.agents):
            await agent.adopt()
            await agent.beat()
            # Spread over one interval: agents started together would otherwise beat together forever.
            phase = agent.heartbeat_interval_s * (i + 1) / len(self.agents)
            self.tasks.append(asyncio.create_task(agent.run_heartbeats(phase), name=f"heartbeat-{agent.id}"))
            self.tasks.append(asyncio.create_task(agent.run_warm(), name=f"warm-{agent.id}"))

    async def stop(self, *, stop_sandboxes: bool = False) -> None:
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.tasks.clear()
        if stop_sandboxes:
            for agent in self.agents:
                for info in agent.list():
                    with contextlib.suppress(Exception):
                        await agent.stop(info.id)


def build_local_fleet(
    plane: ControlPlane,
    directory: LocalAgents,
    *,
    hosts: int,
    runtime: str,
    memory_mb: int,
    cpus: float,
    admission: AdmissionMode,
    policy: AdmissionPolicy,
    heartbeat_interval_s: float,
    max_concurrent_starts: int = 8,
    state_root: Path | None = None,
    seed: int | None = None,
    settle_s: float | None = None,
    max_execs_per_sandbox: int = DEFAULT_EXECS_PER_SANDBOX,
) -> LocalFleet:
    async def sink(hb: AgentHeartbeat) -> HeartbeatReply:
        return await plane.heartbeat_reply(hb)

    root = state_root or Path(os.environ.get("CORRAL_STATE_DIR", "/run/corral"))
    base_seed = random.Random(seed).randrange(1 << 30)
    config = AgentConfig(
        admission=admission,
        policy=policy,
        max_concurrent_starts=max_concurrent_starts,
        heartbeat_interval_s=heartbeat_interval_s,
        settle_s=settle_s,
        max_execs_per_sandbox=max_execs_per_sandbox,
    )
    agents = []
    for i in range(hosts):
        host_id = f"host-{i + 1:02d}"
        rt = build_runtime(runtime, host_id, plane.clock, base_seed + i, root)
        agent = Agent(host_id, rt, memory_mb, cpus, config, clock=plane.clock, sink=sink)
        agents.append(agent)
        directory.add(host_id, LocalAgentClient(agent))
    # The agents live in this process: their own metrics (OOM kills in their sandboxes, refusals by
    # reason) are served on the control plane's /metrics, as a remote agent serves them on its own.
    plane.metrics.registry.register(AgentCollector(agents))
    return LocalFleet(agents, directory)
