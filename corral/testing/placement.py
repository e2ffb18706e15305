"""A harness for the placement step, after Nomad's scheduler harness: the real
:class:`~corral.control.placement.Placement` over a store and an agent directory that record every
reservation and every start it asks for, and refuse them when told (Nomad's ``RejectPlan``): a host the
store has no room on, an agent that says no, a reply that is lost. A placement test then drives the
step directly, without a cluster.

    h = PlacementHarness([host("h1"), host("h2")])
    h.store.full.add("h1")                       # the store refuses reservations on h1
    h.agents.refuse["h2"] = ErrorCode.HOST_STARTS_SATURATED
    rec = await h.sandbox()
    await h.placement.place(Start(rec))          # raises the 503, with why in its explanation
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from corral.agent.client import AgentClient
from corral.agent.errors import AgentError, AgentRefusal, AgentUnavailable
from corral.agent.protocol import Capacity, ExecRequest, SandboxInfo, SandboxSamples, StartSandbox
from corral.control.config import ControlConfig
from corral.control.metrics import Metrics
from corral.control.placement import Placement
from corral.control.ports import FailoverPort
from corral.control.retry import RetryAfter
from corral.control.templates import Templates
from corral.control.view import ViewCache
from corral.core import AdmissionMode, ManualClock
from corral.core.types import DEFAULT_CPUS, DEFAULT_TEMPLATE
from corral.exec_result import ExecResult
from corral.store import (
    CreateOutcome,
    HostRecord,
    RecordNotFound,
    ReservationRecord,
    ReserveItem,
    SandboxRecord,
    SandboxState,
    StateConflict,
    StoreUnavailable,
    TemplateRecord,
)

START = 1_000_000.0  # far from 0, where a never-heard-from host sits


def host(
    host_id: str,
    *,
    memory_mb: int = 16_384,
    cpus: float = 16.0,
    admission: AdmissionMode = AdmissionMode.COMMITTED,
    heartbeat_at: float = START,
) -> HostRecord:
    """An idle host as the store would list it, heard from at ``heartbeat_at``."""
    return HostRecord(
        id=host_id,
        heartbeat_at=heartbeat_at,
        cpu_total=cpus,
        cpu_used=0.0,
        memory_mb_total=memory_mb,
        memory_mb_used=0,
        memory_mb_admittable=memory_mb,
        memory_admission=admission,
        seq=1,
        registered_at=heartbeat_at,
        address="",
        reserved_mb=0,
        reserved_cpu=0.0,
    )


@dataclass(frozen=True, slots=True)
class Reserve:
    """One reservation the step asked for: the hosts it offered, the charge, the host the store took
    (None: refused)."""

    offered: tuple[str, ...]
    memory_mb: int
    took: str | None


@dataclass(frozen=True, slots=True)
class Bind:
    """One start the step asked an agent for."""

    host_id: str
    sandbox_id: str
    epoch: int


class PlanStore:
    """The state of record as far as placement writes it: hosts, sandbox records, reservations. Every
    call is recorded in ``calls``; ``full`` hosts refuse every reservation; ``lose_write_reply``
    lands the next ``running`` write and loses its answer."""

    def __init__(self, hosts: Sequence[HostRecord], clock: ManualClock) -> None:
        self.clock = clock
        self.hosts = {h.id: h for h in hosts}
        self.records: dict[str, SandboxRecord] = {}
        self.reservations: dict[str, ReservationRecord] = {}
        self.templates: dict[str, TemplateRecord] = {}
        self.calls: list[str] = []
        self.reserves: list[Reserve] = []
        self.cancelled: list[str] = []
        # The placement explanation written with each record (JSON text), by sandbox id.
        self.placements: dict[str, str] = {}
        self.full: set[str] = set()
        self.lose_write_reply = False
        self._ids = itertools.count(1)

    # -- hosts and reservations --------------------------------------------------------------------

    async def list_hosts(self) -> list[HostRecord]:
        self.calls.append("list_hosts")
        out = []
        for h in self.hosts.values():
            live = [r for r in self.reservations.values() if r.host_id == h.id]
            out.append(
                replace(h, reserved_mb=sum(r.memory_mb for r in live), reserved_cpu=sum(r.cpu for r in live))
            )
        return out

    def _take(
        self, host_id: str, memory_mb: int, cpu: float, owner: str, ttl_s: float, sid: str | None
    ) -> ReservationRecord:
        now = self.clock.now()
        res = ReservationRecord(
            f"res-{next(self._ids)}", host_id, memory_mb, cpu, owner, sid, now, now + ttl_s
        )
        self.reservations[res.id] = res
        return res

    # The store's own signatures are its contract's (corral.store.contract); the harness takes what
    # placement passes by keyword and is handed to it as the port it stands in for.
    async def reserve(self, host_id: str, *, memory_mb: int, **kw: Any) -> ReservationRecord | None:
        return await self.reserve_best([host_id], memory_mb=memory_mb, **kw)

    async def reserve_best(
        self,
        candidates: Sequence[str],
        *,
        memory_mb: int,
        cpu: float,
        owner: str,
        ttl_s: float,
        sandbox_id: str,
        image: str | None = None,
    ) -> ReservationRecord | None:
        self.calls.append("reserve")
        took = next((h for h in candidates if h in self.hosts and h not in self.full), None)
        self.reserves.append(Reserve(tuple(candidates), memory_mb, took))
        return None if took is None else self._take(took, memory_mb, cpu, owner, ttl_s, sandbox_id)

    async def reserve_batch(
        self, items: Sequence[ReserveItem], *, owner: str, ttl_s: float
    ) -> list[ReservationRecord] | None:
        self.calls.append("reserve_batch")
        ok = all(i.host_id in self.hosts and i.host_id not in self.full for i in items)
        for i in items:
            self.reserves.append(Reserve((i.host_id,), i.memory_mb, i.host_id if ok else None))
        if not ok:
            return None  # all or nothing
        return [self._take(i.host_id, i.memory_mb, i.cpu, owner, ttl_s, i.sandbox_id) for i in items]

    async def cancel(self, reservation_id: str) -> bool:
        self.calls.append("cancel")
        self.cancelled.append(reservation_id)
        return self.reservations.pop(reservation_id, None) is not None

    async def create_sandbox(self, record: SandboxRecord, **kw: Any) -> CreateOutcome:
        self.calls.append("create_sandbox")
        self.records[record.id] = record
        return CreateOutcome(record, replayed=False)

    async def get_sandbox(self, sandbox_id: str, *, tenant_id: str | None = None) -> SandboxRecord | None:
        self.calls.append("get_sandbox")
        return self.records.get(sandbox_id)

    async def set_sandbox_state(
        self,
        sandbox_id: str,
        state: SandboxState,
        *,
        expect: SandboxState,
        expect_version: int | None = None,
        host_id: str | None = None,
        reservation_id: str | None = None,
        placement: str | None = None,
    ) -> SandboxRecord:
        self.calls.append("set_sandbox_state")
        rec = self.records.get(sandbox_id)
        if rec is None:
            raise RecordNotFound(sandbox_id)
        if rec.state is not expect or (expect_version is not None and rec.version != expect_version):
            raise StateConflict(sandbox_id, rec.state, rec.version)
        rec = replace(rec, state=state, version=rec.version + 1)
        if placement is not None:  # a create's write: the host, the reservation, why
            rec = replace(rec, host_id=host_id, reservation_id=reservation_id)
            self.placements[sandbox_id] = placement
        self.records[sandbox_id] = rec
        if self.lose_write_reply:
            self.lose_write_reply = False
            raise StoreUnavailable("the write landed; its answer was lost")
        return rec

    async def reassign_sandbox(
        self, sandbox_id: str, *, expect_version: int, host_id: str, reservation_id: str, placement: str
    ) -> SandboxRecord:
        self.calls.append("reassign_sandbox")
        self.placements[sandbox_id] = placement
        rec = self.records[sandbox_id]
        if rec.version != expect_version:
            raise StateConflict(sandbox_id, rec.state, rec.version)
        rec = self.records[sandbox_id] = replace(
            rec, host_id=host_id, reservation_id=reservation_id, epoch=rec.epoch + 1, version=rec.version + 1
        )
        return rec

    # -- specs -------------------------------------------------------------------------------------

    async def get_template(self, name: str) -> TemplateRecord | None:
        self.calls.append("get_template")
        return self.templates.get(name)

    async def sealed_spec(self, sandbox_id: str) -> str | None:
        return None

    def port(self) -> FailoverPort:
        """This store as the port placement writes through (it has what placement calls of it)."""
        return cast(FailoverPort, self)


class _Client(AgentClient):
    def __init__(self, agents: PlanAgents, host_id: str) -> None:
        self.agents = agents
        self.host_id = host_id

    async def start(self, req: StartSandbox) -> SandboxInfo:
        a = self.agents
        code = a.refuse.get(self.host_id)
        if code is not None:
            raise AgentRefusal(code, f"{self.host_id} refuses (the harness)")
        a.binds.append(Bind(self.host_id, req.id, req.epoch))
        if self.host_id in a.lose_reply:
            raise AgentUnavailable(message=f"{self.host_id} started it; the reply was lost")
        return SandboxInfo.of(req.spec(), started_at=0.0, charged_mb=req.memory_mb)

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        self.agents.stops.append((self.host_id, sandbox_id))

    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        raise AgentError(message="the placement harness runs nothing")

    async def list(self) -> list[SandboxInfo]:
        return []

    async def capacity(self) -> Capacity:
        raise AgentError(message="the placement harness has no capacity to report")

    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        raise AgentError(message="the placement harness measures nothing")


@dataclass
class PlanAgents:
    """Every host's agent: records each start (``binds``) and stop (``stops``); ``refuse`` maps a host
    to the refusal code its agent answers with; a host in ``lose_reply`` starts it, then its answer
    is lost."""

    binds: list[Bind] = field(default_factory=list)
    stops: list[tuple[str, str]] = field(default_factory=list)
    refuse: dict[str, str] = field(default_factory=dict)
    lose_reply: set[str] = field(default_factory=set)

    def client(self, host_id: str, address: str) -> AgentClient:
        return _Client(self, host_id)


class PlacementHarness:
    """The real placement step over a :class:`PlanStore` and :class:`PlanAgents` on a manual clock."""

    def __init__(
        self, hosts: Sequence[HostRecord], config: ControlConfig | None = None, *, seed: int = 0
    ) -> None:
        self.config = config or ControlConfig(replica_id="r1")
        t = self.config.timeouts
        self.clock = ManualClock(START)
        self.store = PlanStore(hosts, self.clock)
        self.agents = PlanAgents()
        self.metrics = Metrics()
        self.view = ViewCache(self.store, self.clock, t.view_ttl_s, t.heartbeat_interval_s)
        retry = RetryAfter(self.clock, t, self.config.retry_after_min_s, self.config.retry_after_max_s)
        self.placement = Placement(
            self.store.port(),
            self.view,
            self.agents,
            Templates(self.store, self.clock),
            self.config,
            self.clock,
            random.Random(seed),
            self.metrics,
            retry,
        )
        self._ids = itertools.count(1)

    async def sandbox(
        self, memory_mb: int = 1024, *, state: SandboxState = SandboxState.RESERVED, **kw: object
    ) -> SandboxRecord:
        """A sandbox record as a create (or failover, or a parked create) hands it to placement."""
        rec = SandboxRecord(
            id=f"sb-{next(self._ids)}",
            tenant_id="t",
            template=DEFAULT_TEMPLATE,
            memory_mb=memory_mb,
            cpus=DEFAULT_CPUS,
            state=state,
            **kw,  # type: ignore[arg-type]
        )
        self.store.records[rec.id] = rec
        return rec

    def placement_doc(self, sandbox_id: str) -> dict[str, Any]:
        """The explanation placement wrote with ``sandbox_id``'s record, as stored (compact)."""
        doc: dict[str, Any] = json.loads(self.store.placements[sandbox_id])
        return doc

    def reset(self) -> None:
        """Forget what was recorded so far (the calls, reserves, binds, stops)."""
        self.store.calls.clear()
        self.store.reserves.clear()
        self.agents.binds.clear()
        self.agents.stops.clear()


__all__ = ["Bind", "PlacementHarness", "PlanAgents", "PlanStore", "Reserve", "host"]
