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
from corral.agent.netslots import pool_for
from corral.agent.protocol import AgentHeartbeat, HeartbeatReply
from corral.control.agents import LocalAgents
from corral.control.plane import ControlPlane
from corral.core import AdmissionMode, AdmissionPolicy, Clock
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX
from corral.images.cache import DEFAULT_IMAGE_CACHE_MB, ImageCache
from corral.runtime.base import KeepsDisks, Runtime
from corral.store import RecordNotFound, SandboxState, StateConflict, StoreError


def process_runtime_available() -> bool:
    try:
        from corral.runtime.process import available
    except ImportError:
        return False
    return bool(available())


def build_runtime(
    kind: str, host_id: str, clock: Clock, seed: int, state_root: Path, images: ImageCache | None = None
) -> Runtime:
    if kind == "sim":
        from corral.runtime.sim import SimRuntime

        return SimRuntime(clock, random.Random(seed))
    if kind == "process":
        from corral.runtime.process import ProcessRuntime

        # One state directory per host, so each agent re-adopts only its own sandboxes.
        runtime: Runtime = ProcessRuntime(
            root=state_root / host_id, cgroup_prefix=f"{host_id}-", images=images
        )
        return runtime
    if kind == "gvisor":
        from corral.runtime.gvisor import GvisorRuntime

        return GvisorRuntime(root=state_root / host_id, cgroup_prefix=f"{host_id}-", images=images)
    raise ValueError(f"unknown runtime {kind!r}")


def _image_cache(plane: ControlPlane, root: Path, budget_mb: int) -> ImageCache | None:
    """A host of this process fetches its images straight from the replica's blob store (None: the
    replica keeps none, so there is nothing to fetch)."""
    blobs = plane.images.blobs
    return None if blobs is None else ImageCache(root, blobs, budget_mb << 20)


@dataclass
class LocalFleet:
    agents: list[Agent]
    directory: LocalAgents
    plane: ControlPlane | None = None  # whose records follow what these agents run
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def start(self) -> None:
        for i, agent in enumerate(self.agents):
            await agent.adopt()
            if agent.netslots is not None:
                agent.netslots.refill()
            await agent.beat()
            # Spread over one interval: agents started together would otherwise beat together forever.
            phase = agent.heartbeat_interval_s * (i + 1) / len(self.agents)
            self.tasks.append(asyncio.create_task(agent.run_heartbeats(phase), name=f"heartbeat-{agent.id}"))
            self.tasks.append(asyncio.create_task(agent.run_warm(), name=f"warm-{agent.id}"))

    async def stop(self, *, stop_sandboxes: bool = False) -> list[str]:
        """Stop the agents' loops, and with ``stop_sandboxes`` their sandboxes: those it stopped."""
        for t in self.tasks:
            t.cancel()
        for t in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self.tasks.clear()
        ended = []
        if stop_sandboxes:
            for agent in self.agents:
                for info in agent.list():
                    with contextlib.suppress(Exception):
                        await agent.stop(info.id)
                        ended.append(info.id)
        for agent in self.agents:
            if agent.netslots is not None:
                await agent.netslots.close()  # the ready ones; those in use stay with their sandboxes
            if isinstance(agent.runtime, KeepsDisks):
                await agent.runtime.drain_disks()  # likewise
        return ended

    async def record_stopped(self, sandbox_ids: list[str]) -> None:
        """Mark ``stopped`` the records of sandboxes these agents stopped (their ``running`` records
        would otherwise outlive them until the reconciler has seen two listings without them)."""
        if self.plane is None:
            return
        for sid in sandbox_ids:
            with contextlib.suppress(StateConflict, RecordNotFound, StoreError):
                await self.plane.store.set_sandbox_state(
                    sid, SandboxState.STOPPED, expect=SandboxState.RUNNING
                )

    async def correct_records(self) -> list[str]:
        """Once the agents have adopted what their runtimes still run: every record that says a
        sandbox runs on one of these hosts, and that no agent adopted, is marked ``stopped`` (these
        agents' listings are the whole truth about their hosts, so nothing need be seen twice)."""
        if self.plane is None:
            return []
        gone = []
        for agent in self.agents:
            running = {info.id for info in agent.list()}
            cursor: str | None = None
            while True:
                page = await self.plane.store.list_sandboxes(
                    host_id=agent.id, state=SandboxState.RUNNING, limit=1000, cursor=cursor
                )
                gone += [r.id for r in page.items if r.id not in running]
                cursor = page.next_cursor
                if cursor is None:
                    break
        await self.record_stopped(gone)
        return gone


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
    image_cache_mb: int = DEFAULT_IMAGE_CACHE_MB,
    network_slots: int = 2,
) -> LocalFleet:
    async def sink(hb: AgentHeartbeat) -> HeartbeatReply:
        return await plane.heartbeat_reply(hb)

    root = state_root or Path(os.environ.get("CORRAL_STATE_DIR", "/run/corral"))
    base_seed = random.Random(seed).randrange(1 << 30)
    agents = []
    for i in range(hosts):
        host_id = f"host-{i + 1:02d}"
        config = AgentConfig(
            host_id,
            memory_mb,
            cpus,
            admission=admission,
            policy=policy,
            max_concurrent_starts=max_concurrent_starts,
            heartbeat_interval_s=heartbeat_interval_s,
            settle_s=settle_s,
            max_execs_per_sandbox=max_execs_per_sandbox,
        )
        images = _image_cache(plane, root / "images" / host_id, image_cache_mb)
        rt = build_runtime(runtime, host_id, plane.clock, base_seed + i, root, images)
        slots = pool_for(rt, root / host_id, network_slots)
        agent = Agent(config, rt, clock=plane.clock, sink=sink, images=images, netslots=slots)
        agents.append(agent)
        directory.add(host_id, LocalAgentClient(agent))
    # The agents live in this process: their own metrics (OOM kills in their sandboxes, refusals by
    # reason) are served on the control plane's /metrics, as a remote agent serves them on its own.
    plane.metrics.registry.register(AgentCollector(agents))
    return LocalFleet(agents, directory, plane)
