"""The agent's side of warm pools: refilling its targets, handing one over, giving the room back.

A refill never takes the last start slot (real creates come first), never starts what the gate would
not admit without evicting, and counts a start before its first await, so a host never holds more warm
sandboxes than its target plus the starts in flight. A real create that does not fit evicts ready warm
sandboxes first; refills then pause, since the room is wanted by real work. A claim is a pop from the
book and nothing else: no I/O, no await, so two claims can never take the same sandbox.

Kept apart from :class:`~corral.agent.agent.Agent`, which owns the gate, the live set and the starts
limiter this works through.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from corral.agent.errors import AgentWarmEmpty
from corral.agent.protocol import ClaimWarm, SandboxInfo, StartSandbox, WarmTarget
from corral.core.admission import charge_mb, fits
from corral.core.types import CreateRequest
from corral.ids import new_sandbox_id

if TYPE_CHECKING:
    from corral.agent.agent import Agent

log = logging.getLogger("corral.agent.warm")

# After a create had to evict warm sandboxes (the host is full), refills wait this long: the room is
# wanted by real work, and a refill would only be evicted again.
WARM_PAUSE_S = 5.0


class WarmKeeper:
    def __init__(self, agent: Agent, starts_per_round: int = 2, fill_interval_s: float = 0.05) -> None:
        self.agent = agent
        self.starts_per_round = starts_per_round
        self.fill_interval_s = fill_interval_s
        # Warm starts may hold at most this many start slots, so real creates always find one free.
        self.max_in_flight = max(1, agent.limiter.limit // 2)
        self.in_flight = 0
        self.paused_until = 0.0

    def _fits(self, admittable: int, req: CreateRequest) -> bool:
        a = self.agent
        return fits(admittable, a.pending_mb, req, a.admission, a.policy)

    def charge(self) -> tuple[int, float]:
        """Memory and CPU the ready warm sandboxes hold: room any real create may take."""
        a = self.agent
        mb, cpus = 0, 0.0
        for sandbox_id in a.warm.ready_ids():
            live = a._live.get(sandbox_id)
            if live is not None:
                spec = live.spec
                mb += charge_mb(spec.memory_mb, spec.stateful, a.admission, live.resident_mb, a.policy)
                cpus += spec.cpus
        return mb, cpus

    def evict_for(self, req: CreateRequest) -> bool:
        """Stop ready warm sandboxes until ``req`` fits; False (nothing evicted) if even all of them
        would not make room. Their charge leaves the book at once; the runtime stops them after."""
        a = self.agent
        if not self._fits(a.admittable_mb() + self.charge()[0], req):
            return False
        self.paused_until = a.clock.now() + WARM_PAUSE_S
        for sandbox_id in list(a.warm.evictable()):
            if self._fits(a.admittable_mb(), req):
                break
            a.warm.take_ready(sandbox_id)
            a._live.pop(sandbox_id, None)
            a.warm.stats.evictions += 1
            a._in_background(a._reap(sandbox_id))
        return True

    def claim(self, template: str, req: ClaimWarm) -> SandboxInfo:
        """Hand over one ready warm sandbox of ``template``; raises :class:`AgentWarmEmpty` at once when
        none is ready."""
        a = self.agent
        began = a.clock.now()
        sandbox_id = a.warm.pop(template, req.env)
        if sandbox_id is None:
            raise AgentWarmEmpty(message=f"no ready warm sandbox of template {template!r} on {a.id}")
        info = a._info(sandbox_id, a._live[sandbox_id])
        a.warm.stats.observe_claim(max(0.0, a.clock.now() - began))
        return info

    def replenish(self) -> int:
        """One refill round: stop what is over target, then start up to ``starts_per_round`` toward
        the targets. Returns how many starts began."""
        a = self.agent
        for sandbox_id in a.warm.surplus():
            a.warm.take_ready(sandbox_id)
            a._in_background(a.stop(sandbox_id))
        if a.clock.now() < self.paused_until or not a.gate.is_open:
            return 0
        begun = 0
        for template, target in list(a.warm.targets.items()):
            if a.templates is not None and template not in a.templates:
                continue
            creq = CreateRequest(memory_mb=target.memory_mb, cpu=target.cpus, stateful=target.stateful)
            while a.warm.deficit(template) > 0 and begun < self.starts_per_round:
                if self.in_flight >= self.max_in_flight or a.limiter.saturated:
                    return begun
                if a.limiter.in_flight >= a.limiter.limit - 1:
                    return begun  # the last slot is a real create's
                if not self._fits(a.admittable_mb(), creq):
                    break
                a.warm.starting(template)  # counted before the first await: never over target
                self.in_flight += 1
                begun += 1
                a.warm.stats.replenish_starts += 1
                a._in_background(self._start(target, creq))
        return begun

    async def _start(self, target: WarmTarget, creq: CreateRequest) -> None:
        a = self.agent
        started: str | None = None
        try:
            await a.limiter.acquire()  # not saturated (checked without an await): takes a slot at once
            try:
                req = StartSandbox(
                    id=new_sandbox_id(a.clock.now()),
                    memory_mb=target.memory_mb,
                    cpus=target.cpus,
                    stateful=target.stateful,
                    template=target.template,
                    image=target.image,
                    disk_mb=target.disk_mb,
                    user=target.user,
                    workdir=target.workdir,
                )
                await a._run_start(req, creq)
                started = req.id
            finally:
                a.limiter.release()
        except Exception as exc:
            a.warm.stats.replenish_failures += 1
            log.info("agent %s: warm start of %s failed: %r", a.id, target.template, exc)
        finally:
            self.in_flight -= 1
            a.warm.started(target.template, started)

    async def run(self) -> None:
        """Refill every ``fill_interval_s`` until cancelled."""
        while True:
            try:
                self.replenish()
            except Exception:
                log.exception("agent %s: warm refill failed", self.agent.id)
            await asyncio.sleep(self.fill_interval_s)
