"""Batch create: N sandboxes of one spec, reserved all or nothing in one transaction, then started.

Every member is decided against the view plus the batch's own earlier members (a scheduler with a
ledger of its own), the whole set is reserved in one store transaction, and the members are started
with at most ``PER_HOST_STARTS`` in flight per host, retrying a host's "too many starts" refusal while
the reservation holds. If any member cannot start, the ones that did are stopped and every claim ends:
a batch lands whole or leaves nothing.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import Mapping

from corral.agent.errors import AgentError, AgentRefusal
from corral.codes import ErrorCode
from corral.control.binding import elsewhere_reason
from corral.control.create import CreateFlow, CreateSpec
from corral.control.errors import InvalidRequest
from corral.control.explain import Explanation
from corral.control.view import FleetSnapshot
from corral.core import CreateRequest, Ledger, NoCapacity, NoHealthyHosts, Scheduler
from corral.store import (
    RecordNotFound,
    ReservationRecord,
    ReserveItem,
    SandboxRecord,
    SandboxState,
    StateConflict,
)

# Below the agents' default starts limit (8), so one batch does not saturate a host by itself.
PER_HOST_STARTS = 4
SATURATED_RETRIES = 5


class BatchCreate:
    def __init__(self, flow: CreateFlow) -> None:
        self.flow = flow

    async def create(self, tenant_id: str, spec: CreateSpec, count: int) -> list[SandboxRecord]:
        if spec.name is not None:
            raise InvalidRequest("spec.name", "a batch cannot share one name")
        flow = self.flow
        started = flow.clock.now()
        records: list[SandboxRecord] = []
        try:
            for _ in range(count):
                records.append((await flow.new_record(tenant_id, spec, None))[0])
            placed = await self._reserve_and_start(records, spec.env)
        except BaseException:
            for r in records:
                await flow.forget(r)
            raise
        for p in placed:
            flow.observe_success(p, started, tenant_id, None)
        return placed

    async def _decide(
        self, records: list[SandboxRecord], snap: FleetSnapshot, explains: dict[str, Explanation]
    ) -> list[ReserveItem]:
        flow = self.flow
        first = records[0]
        req = CreateRequest(memory_mb=first.memory_mb, cpu=first.cpus, stateful=first.stateful)
        ledger = Ledger(flow.clock, ttl_s=flow.config.timeouts.reservation_ttl_s)
        sched = Scheduler(flow.placer(len(snap.hosts)), ledger, flow.rng, owner="batch")
        base = flow.view.pending_fn(snap)
        items = []
        for rec in records:
            explain = explains[rec.id] = Explanation(req)
            decision, _ = sched.schedule(snap.hosts, req, now=flow.clock.now(), base_pending=base)
            # A batch reserves exactly the hosts its decisions chose, all or nothing.
            attempt = explain.decided(decision)
            attempt.offered([decision.host.id])
            attempt.took(decision.host.id)
            items.append(ReserveItem(decision.host.id, decision.charge_mb, req.cpu, rec.id))
        return items

    async def _reserve_and_start(
        self, records: list[SandboxRecord], env: Mapping[str, str]
    ) -> list[SandboxRecord]:
        flow = self.flow
        cfg = flow.config
        snap = await flow.view.get()
        reserved: list[ReservationRecord] | None = None
        explains: dict[str, Explanation] = {}
        for fresh in (False, True):
            if fresh:
                snap = await flow.view.get(fresh=True)  # a cached absence is not a death
            try:
                items = await self._decide(records, snap, explains)
            except (NoCapacity, NoHealthyHosts) as refusal:
                if fresh:
                    # the member that could not be placed: the one whose explanation has no attempt
                    failed = next((e for e in explains.values() if not e.attempts), None)
                    raise flow.refused(refusal, snap, Counter(), failed) from None
                continue
            reserved = await flow.store.reserve_batch(
                items, owner=cfg.replica_id, ttl_s=cfg.timeouts.reservation_ttl_s
            )
            if reserved is not None:
                break
            flow.metrics.reserve_conflicts.inc()
        if reserved is None:
            raise flow.refused(NoCapacity({}, len(snap.hosts)), snap, Counter())
        claims = [flow.view.claim(r.host_id, r.memory_mb, r.cpu) for r in reserved]
        for c in claims:
            flow.view.committed(c)
        gates: dict[str, asyncio.Semaphore] = defaultdict(lambda: asyncio.Semaphore(PER_HOST_STARTS))
        results = await asyncio.gather(
            *(
                self._start(rec, res, snap, env, gates[res.host_id], explains[rec.id])
                for rec, res in zip(records, reserved, strict=True)
            ),
            return_exceptions=True,
        )
        failures = [r for r in results if isinstance(r, BaseException)]
        if not failures:
            return [r for r in results if isinstance(r, SandboxRecord)]
        # All or nothing: stop every member that may have started, end every claim.
        for rec, res in zip(records, reserved, strict=True):
            await flow.binder.stop_quietly(res.host_id, snap.address(res.host_id), rec.id)
            await flow.cancel_quietly(res.id)
        for c in claims:
            c.release()
        reasons = Counter(r for r in map(elsewhere_reason, failures) if r is not None)
        if len(reasons) == len(failures) or (
            not reasons and all(isinstance(f, AgentError) for f in failures)
        ):
            raise flow.refused(NoCapacity({}, len(snap.hosts)), snap, reasons)
        raise failures[0]

    async def _start(
        self,
        record: SandboxRecord,
        res: ReservationRecord,
        snap: FleetSnapshot,
        env: Mapping[str, str],
        gate: asyncio.Semaphore,
        explain: Explanation,
    ) -> SandboxRecord:
        flow = self.flow
        address = snap.address(res.host_id)
        async with gate:
            for attempt in range(SATURATED_RETRIES + 1):
                try:
                    await flow.binder.start(
                        record, res.host_id, address, env, await flow.pids_of(record.template)
                    )
                    break
                except AgentRefusal as e:
                    # Too many starts at once is "wait a moment", and the reservation still holds.
                    if e.code != ErrorCode.HOST_STARTS_SATURATED or attempt == SATURATED_RETRIES:
                        raise
                    await asyncio.sleep(0.05 * (attempt + 1))
        explain.placed(res.host_id, res.id)
        try:
            return await flow.store.set_sandbox_state(
                record.id,
                SandboxState.RUNNING,
                expect=SandboxState.RESERVED,
                host_id=res.host_id,
                reservation_id=res.id,
                placement=explain.to_json(),
            )
        except (StateConflict, RecordNotFound):
            # Settled by the leader while this replica's lease had lapsed: as a single create is.
            return await flow.settled_meanwhile(record, res, None)
