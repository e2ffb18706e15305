"""A create whose replica died (or lost its lease) between writing its record and binding it, on an
injected clock over both stores: the leader resolves the record as soon as the replica's lease has
lapsed, not after the longest create. A client's retry with the same Idempotency-Key then gets the
sandbox a host runs, or a fresh placement; never two copies, never a reservation left behind. A record
that names no replica is resolved only at the create deadline."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Coroutine, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from corral.agent.agent import Agent
from corral.agent.client import LocalAgentClient
from corral.agent.config import AgentConfig
from corral.agent.protocol import SandboxInfo, StartSandbox
from corral.codes import ErrorCode
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.create import CreateSpec
from corral.control.errors import ResourceNotFound, Unavailable
from corral.control.heartbeats import to_store
from corral.control.plane import ControlPlane, build_replica
from corral.core import ManualClock, Timeouts
from corral.runtime.sim import SimRuntime
from corral.store import SandboxRecord, SandboxState, Store, StoreUnavailable, open_store
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

T0 = 1_000_000.0
HOSTS = ("h0", "h1", "h2")
LEASE_S = 15.0
SPEC = CreateSpec(memory_mb=512, cpus=0.5)
TIMEOUTS = Timeouts(heartbeat_interval_s=2, stale_after_s=10, dead_after_s=600, view_ttl_s=0)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'corral.db'}"
        return
    base, schema = require_pg(), new_schema_name("corral_unbound")
    try:
        yield with_schema(base, schema)
    finally:
        drop_schema(base, schema)


class HeldReply(LocalAgentClient):
    """An agent reached by a replica whose start reply is held: the sandbox starts, the answer waits."""

    def __init__(self, agent: Agent, release: asyncio.Event) -> None:
        super().__init__(agent)
        self.release = release

    async def start(self, req: StartSandbox) -> SandboxInfo:
        info = await super().start(req)
        await self.release.wait()
        return info


@dataclass
class World:
    store: Store
    clock: ManualClock
    agents: dict[str, Agent]
    tenant: str

    def plane(
        self, replica_id: str, directory: LocalAgents | None = None, timeouts: Timeouts = TIMEOUTS
    ) -> ControlPlane:
        if directory is None:
            directory = LocalAgents()
            for h, a in self.agents.items():
                directory.add(h, LocalAgentClient(a))
        config = ControlConfig(replica_id=replica_id, timeouts=timeouts, replica_lease_s=LEASE_S)
        return build_replica(self.store, directory, config, self.clock, random.Random(replica_id))

    async def beat(self) -> None:
        for agent in self.agents.values():
            await self.store.upsert_heartbeat(to_store(agent.heartbeat()))

    async def later(self, seconds: float, *live: ControlPlane) -> None:
        """Time passes: live replicas renew their leases, every host heartbeats."""
        self.clock.advance(seconds)
        for p in live:
            await self.store.renew_replica(p.config.replica_id, p.config.replica_lease_s)
        await self.beat()

    def copies(self, sandbox_id: str) -> list[str]:
        return [h for h, a in self.agents.items() if sandbox_id in a.sandbox_ids()]


@pytest.fixture
async def w(store_url: str) -> AsyncIterator[World]:
    clock = ManualClock(T0)
    store = open_store(store_url, clock=clock)
    await store.migrate()
    agents = {
        h: Agent(AgentConfig(h, 8192, 8.0), SimRuntime(clock, random.Random(h)), clock=clock) for h in HOSTS
    }
    tenant = await store.create_tenant("t", max_sandboxes=20, max_memory_mb=1 << 20)
    w = World(store, clock, agents, tenant.id)
    await w.beat()
    try:
        yield w
    finally:
        await store.close()


async def _left_by_a_dead_replica(w: World, *, started_on: str | None, owner: str | None = "r-dead") -> str:
    """What a replica that died mid-create leaves: its record (naming it, unless written before records
    named their replica), its reservation, and, if it got that far, the sandbox started on a host."""
    dead = w.plane("r-dead")
    await w.store.renew_replica("r-dead", LEASE_S)
    draft = replace(await dead.creates.draft(w.tenant, SPEC), owner=owner)
    out = await w.store.create_sandbox(draft, idempotency_key="key-1", request_hash=SPEC.fingerprint())
    assert not out.replayed and out.record.owner == owner and out.record.state is SandboxState.RESERVED
    res = await w.store.reserve(
        started_on or HOSTS[0], memory_mb=512, cpu=0.5, owner="r-dead", ttl_s=120.0, sandbox_id=draft.id
    )
    assert res is not None
    if started_on is not None:
        await w.agents[started_on].start(StartSandbox(id=draft.id, memory_mb=512, cpus=0.5))
    return draft.id


async def _in_progress(p: ControlPlane, tenant: str) -> None:
    with pytest.raises(Unavailable) as err:
        await p.creates.create(tenant, SPEC, idempotency_key="key-1")
    assert err.value.code == ErrorCode.CREATE_IN_PROGRESS


async def test_a_create_its_replica_left_unplaced_is_retried_anew_once_the_lease_lapses(w: World) -> None:
    leader = w.plane("r-live")
    sid = await _left_by_a_dead_replica(w, started_on=None)
    await w.later(LEASE_S - 5, leader)
    await leader.reconciler.tick()
    assert leader.reconciler.is_leader
    # Its replica's lease still holds: the create may yet bind, and a retry is told to wait.
    assert (await w.store.get_sandbox(sid)).state is SandboxState.RESERVED  # type: ignore[union-attr]
    await _in_progress(leader, w.tenant)
    await w.later(5, leader)
    await leader.reconciler.tick()
    # Lapsed, long before the create deadline: no host runs it, so the create never happened.
    assert leader.config.create_deadline_s > 10 * LEASE_S
    assert await w.store.get_sandbox(sid) is None
    assert await w.store.outstanding() == {}
    placed, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert not replayed and placed.id != sid and placed.state is SandboxState.RUNNING
    assert w.copies(placed.id) == [placed.host_id] and w.copies(sid) == []
    # The key now names the new sandbox.
    again, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert replayed and again.id == placed.id


async def test_a_create_a_host_runs_is_that_hosts_once_the_lease_lapses(w: World) -> None:
    leader = w.plane("r-live")
    sid = await _left_by_a_dead_replica(w, started_on="h1")
    await w.later(1, leader)
    await leader.reconciler.tick()
    await _in_progress(leader, w.tenant)
    await w.later(LEASE_S, leader)
    await leader.reconciler.tick()
    resolved = await w.store.get_sandbox(sid)
    assert resolved is not None and (resolved.state, resolved.host_id) == (SandboxState.RUNNING, "h1")
    got, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert replayed and (got.id, got.host_id) == (sid, "h1")
    assert w.copies(sid) == ["h1"]
    assert await w.store.outstanding() == {}
    assert (await w.store.usage(w.tenant)).sandboxes == 1


async def test_a_record_naming_no_replica_waits_for_the_create_deadline(w: World) -> None:
    leader = w.plane("r-live")
    sid = await _left_by_a_dead_replica(w, started_on=None, owner=None)
    deadline = leader.config.create_deadline_s
    await w.later(deadline - 1, leader)
    await leader.reconciler.tick()
    assert (await w.store.get_sandbox(sid)).state is SandboxState.RESERVED  # type: ignore[union-attr]
    await w.later(1, leader)
    await leader.reconciler.tick()
    assert await w.store.get_sandbox(sid) is None
    placed, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert not replayed and placed.id != sid


async def _held_replies(w: World) -> tuple[ControlPlane, ControlPlane, asyncio.Event]:
    """A slow replica whose agents' start replies wait for the event returned, and a leader."""
    release = asyncio.Event()
    held = LocalAgents()
    for h, a in w.agents.items():
        held.add(h, HeldReply(a, release))
    slow, leader = w.plane("r-slow", held), w.plane("r-live")
    await w.store.renew_replica("r-slow", LEASE_S)
    await leader.reconciler.tick()
    return slow, leader, release


T = TypeVar("T")


async def _lapsed_while_held(w: World, call: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """``call`` runs until a start's reply is held; then the slow replica's lease lapses."""
    task = asyncio.get_running_loop().create_task(call)
    while not any(a.sandbox_ids() for a in w.agents.values()):
        await asyncio.sleep(0)
    w.clock.advance(LEASE_S + 1)
    await w.store.renew_replica("r-live", LEASE_S)
    return task


async def _slow_create(
    w: World, *, listed_before_settled: bool, retried_meanwhile: bool = False
) -> tuple[ControlPlane, asyncio.Task[tuple[SandboxRecord, bool]], SandboxRecord | None]:
    """A live replica whose lease lapses while its start's reply is held; the leader resolves its
    record meanwhile (as running, when a heartbeat listed the sandbox first), and the client may
    retry on the leader with the same key before the reply comes."""
    slow, leader, release = await _held_replies(w)
    create = await _lapsed_while_held(w, slow.creates.create(w.tenant, SPEC, idempotency_key="key-1"))
    if listed_before_settled:
        await w.beat()
    await leader.reconciler.tick()
    retry = None
    if retried_meanwhile:
        await w.beat()
        retry, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
        assert not replayed
    release.set()
    await asyncio.wait([create])
    return leader, create, retry


async def test_a_slow_create_settled_as_running_keeps_its_copy(w: World) -> None:
    _, create, _ = await _slow_create(w, listed_before_settled=True)
    placed, replayed = create.result()
    assert not replayed and placed.state is SandboxState.RUNNING
    assert w.copies(placed.id) == [placed.host_id]
    assert await w.store.outstanding() == {}


async def test_a_start_that_timed_out_where_the_leader_settled_it_keeps_that_copy(w: World) -> None:
    # The host started it, but its answer never came: the bind times out (in real time, 2 s) after
    # this replica's lease lapsed and the leader, seeing a heartbeat list it, resolved it as running there.
    held = LocalAgents()
    for h, a in w.agents.items():
        held.add(h, HeldReply(a, asyncio.Event()))
    slow = w.plane("r-slow", held, replace(TIMEOUTS, bind_timeout_s=2.0))
    leader = w.plane("r-live")
    await w.store.renew_replica("r-slow", LEASE_S)
    await leader.reconciler.tick()
    create = await _lapsed_while_held(w, slow.creates.create(w.tenant, SPEC, idempotency_key="key-1"))
    await w.beat()
    await leader.reconciler.tick()
    (started,) = [h for h, a in w.agents.items() if a.sandbox_ids()]
    placed, replayed = await create
    # The record names the copy that runs: it is the sandbox, not one to stop and place again.
    assert not replayed and (placed.state, placed.host_id) == (SandboxState.RUNNING, started)
    assert w.copies(placed.id) == [started]
    assert sum(len(a.sandbox_ids()) for a in w.agents.values()) == 1
    again, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert replayed and again.id == placed.id


async def test_a_slow_create_settled_as_never_made_is_written_again_as_placed(w: World) -> None:
    leader, create, _ = await _slow_create(w, listed_before_settled=False)
    placed, replayed = create.result()
    assert not replayed and placed.state is SandboxState.RUNNING and placed.host_id is not None
    assert await w.store.get_sandbox(placed.id) == placed
    assert w.copies(placed.id) == [placed.host_id]
    assert (await w.store.usage(w.tenant)).sandboxes == 1
    # Its key names it again: a retry gets it, nothing new is made.
    await w.beat()
    again, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert replayed and again.id == placed.id


async def test_a_slow_create_whose_key_a_retry_took_is_undone(w: World) -> None:
    leader, create, retry = await _slow_create(w, listed_before_settled=False, retried_meanwhile=True)
    assert retry is not None
    err = create.exception()
    assert isinstance(err, Unavailable) and err.code == ErrorCode.CREATE_IN_PROGRESS
    # It names the sandbox the key names now; the copy it started is stopped and its record stays
    # gone: the retry's sandbox is the one.
    assert err.details["sandbox_id"] == retry.id
    assert [sid for a in w.agents.values() for sid in a.sandbox_ids()] == [retry.id]
    assert [r.id for r in (await w.store.list_sandboxes()).items] == [retry.id]
    assert w.copies(retry.id) == [retry.host_id]
    await w.beat()
    assert await w.store.outstanding() == {}
    again, replayed = await leader.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert replayed and again.id == retry.id


async def test_a_slow_batch_settled_as_never_made_is_written_again_as_placed(w: World) -> None:
    slow, leader, release = await _held_replies(w)
    batch = await _lapsed_while_held(w, slow.batches.create(w.tenant, SPEC, 2))
    await leader.reconciler.tick()
    release.set()
    placed = await batch
    assert len(placed) == 2 and all(p.state is SandboxState.RUNNING for p in placed)
    for p in placed:
        assert await w.store.get_sandbox(p.id) == p and w.copies(p.id) == [p.host_id]
    assert (await w.store.usage(w.tenant)).sandboxes == 2


async def test_a_sandbox_deleted_while_it_is_placed_stays_deleted(w: World) -> None:
    # Its client (or an admin) deletes it while its start's reply is held: no lease lapses, nothing is
    # resolved, and the create must not write it back as placed.
    slow, leader, release = await _held_replies(w)
    create = asyncio.get_running_loop().create_task(slow.creates.create(w.tenant, SPEC))
    while not any(a.sandbox_ids() for a in w.agents.values()):
        await asyncio.sleep(0)
    (reserved,) = (await w.store.list_sandboxes()).items
    await leader.sandboxes.delete(reserved.id, w.tenant)
    release.set()
    await asyncio.wait([create])
    assert isinstance(create.exception(), ResourceNotFound)
    assert w.copies(reserved.id) == []
    assert (await w.store.usage(w.tenant)).sandboxes == 0
    await w.beat()
    await leader.reconciler.tick()  # the tombstone goes
    assert await w.store.get_sandbox(reserved.id) is None
    assert await w.store.outstanding() == {}


class LostReply:
    """The store, but the reply to a sandbox's move to ``running`` is lost after the write landed."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def set_sandbox_state(self, sandbox_id: str, state: SandboxState, **kw: Any) -> SandboxRecord:
        done = await self._store.set_sandbox_state(sandbox_id, state, **kw)
        if state is SandboxState.RUNNING:
            raise StoreUnavailable("the reply was lost")
        return done


async def test_a_create_whose_last_write_landed_unanswered_answers_with_what_it_made(w: World) -> None:
    directory = LocalAgents()
    for h, a in w.agents.items():
        directory.add(h, LocalAgentClient(a))
    config = ControlConfig(replica_id="r-lossy", timeouts=TIMEOUTS, replica_lease_s=LEASE_S)
    lossy = build_replica(LostReply(w.store), directory, config, w.clock, random.Random(1))  # type: ignore[arg-type]
    await w.store.renew_replica("r-lossy", LEASE_S)
    placed, replayed = await lossy.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    # The record says the copy runs there, as it does: that is the sandbox (never a record kept while
    # its copy is stopped, nor a copy stopped that a record names).
    assert not replayed and placed.state is SandboxState.RUNNING and placed.host_id is not None
    assert [sid for a in w.agents.values() for sid in a.sandbox_ids()] == [placed.id]
    assert w.copies(placed.id) == [placed.host_id]
    assert (await w.store.usage(w.tenant)).sandboxes == 1
    await w.beat()
    assert await w.store.outstanding() == {}
    again, replayed = await lossy.creates.create(w.tenant, SPEC, idempotency_key="key-1")
    assert replayed and again.id == placed.id
