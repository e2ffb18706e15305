"""Batch create: N sandboxes of one spec, reserved all or nothing in one transaction, then started.

Every member is decided by the placement step against the view plus the batch's earlier members
(:meth:`~corral.control.placement.Snapshot.including`), the whole set is reserved in one store
transaction, and the members are started with at most ``PER_HOST_STARTS`` in flight per host,
retrying a host's "too many starts" refusal while the reservation holds. If any member cannot start,
the ones that did are stopped and every claim ends: a batch lands whole or leaves nothing.
"""

from __future__ import annotations

from collections import Counter

from corral.control.create import CreateFlow, CreateSpec
from corral.control.errors import InvalidRequest
from corral.control.explain import Explanation
from corral.control.placement import Placement, Plan, Start
from corral.control.seal import Spec
from corral.core import NoCapacity, NoHealthyHosts
from corral.store import SandboxRecord


class BatchCreate:
    def __init__(self, creates: CreateFlow, placement: Placement) -> None:
        self.creates = creates
        self.placement = placement

    async def create(self, tenant_id: str, spec: CreateSpec, count: int) -> list[SandboxRecord]:
        if spec.name is not None:
            raise InvalidRequest("spec.name", "a batch cannot share one name")
        creates = self.creates
        started = creates.clock.now()
        creates.admit(tenant_id, count)
        records: list[SandboxRecord] = []
        async with creates.gate.slot(tenant_id):
            try:
                for _ in range(count):
                    records.append((await creates.new_record(tenant_id, spec, None))[0])
                placed = await self._place(records, spec.contents())
            except BaseException:
                for r in records:
                    await creates.forget(r)
                raise
        if creates.ready is not None:
            await creates.ready.settle_all(placed)
        for p in placed:
            creates.observe_success(p, started, tenant_id, None)
        return placed

    async def _place(self, records: list[SandboxRecord], contents: Spec) -> list[SandboxRecord]:
        step = self.placement
        req = records[0].request()
        starts = [Start.of(rec, contents) for rec in records]
        fleet = await step.view.get()
        for fresh in (False, True):
            if fresh:
                fleet = await step.view.get(fresh=True)  # a cached absence is not a death
            snapshot = step.snapshot(fleet)
            plans: list[Plan] = []
            explains: list[Explanation] = []
            try:
                for _ in records:
                    explain = Explanation(req)
                    explains.append(explain)
                    plan = step.decide(snapshot.including(plans), req)
                    explain.tried(plan.attempt)
                    plans.append(plan)
            except (NoCapacity, NoHealthyHosts) as refusal:
                if fresh:
                    # The member that could not be placed: the last, whose explanation has no attempt.
                    raise step.refused(refusal, fleet, Counter(), explains[-1]) from None
                continue
            placed = await step.apply_all(plans, starts, fleet, explains)
            if placed is not None:
                return placed
        raise step.refused(NoCapacity({}, len(fleet.hosts)), fleet, Counter())
