"""Reading, executing in and deleting sandboxes that exist. Tenant-scoped: another tenant's sandbox
is simply not found."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field

from corral.agent.client import AgentClient
from corral.agent.errors import (
    AgentBusy,
    AgentCommandNotFound,
    AgentConflict,
    AgentError,
    AgentInvalid,
    AgentSandboxNotFound,
    AgentUnavailable,
)
from corral.agent.execstream import ExecEvents
from corral.agent.protocol import EgressPolicyBody, ExecRequest
from corral.codes import ErrorCode
from corral.control import network
from corral.control.errors import (
    BadGateway,
    Gone,
    InvalidRequest,
    NotRunning,
    ResourceNotFound,
    SandboxIsPaused,
    TooManyConcurrent,
    Unavailable,
)
from corral.control.locations import Location, LocationCache
from corral.control.ports import AgentLookup, CreatePort
from corral.control.view import ViewCache
from corral.core.inflight import BUSY_RETRY_S, DEFAULT_EXECS_PER_TENANT, InFlight
from corral.core.netpolicy import EgressPolicy
from corral.exec_result import ExecEvent, ExecResult
from corral.shapes.commands import CommandInfo, CommandList, CommandOutput
from corral.store import Page, SandboxRecord, SandboxState, StateConflict, StoreUnavailable

GONE_STATES = {SandboxState.DELETED, SandboxState.STOPPED, SandboxState.FAILED}
# How long a GET waits for a host to say what a sandbox's disk holds: a GET is polled, and a slow or
# unreachable host must not make it slow; past this the field is null and the record is shown.
DISK_USED_WAIT_S = 0.5


@dataclass(eq=False, repr=False)
class Sandboxes:
    """``calls_per_tenant``: how many data-plane calls one tenant may have in flight through this
    replica (a replica's own count: N replicas let a tenant have N times as many, and each sandbox's
    agent bounds the sandbox's own whichever replica forwards)."""

    store: CreatePort
    view: ViewCache
    agents: AgentLookup
    locations: LocationCache
    calls_per_tenant: InitVar[int] = DEFAULT_EXECS_PER_TENANT
    execs_per_sandbox: InitVar[int | None] = None
    calls: InFlight = field(init=False)
    # Keyed by tenant and the id it named: one tenant naming another's sandbox holds only its own.
    sandbox_calls: InFlight | None = field(init=False)

    def __post_init__(self, calls_per_tenant: int, execs_per_sandbox: int | None) -> None:
        self.calls = InFlight("tenant", calls_per_tenant)
        self.sandbox_calls = InFlight("sandbox", execs_per_sandbox) if execs_per_sandbox else None

    @contextmanager
    def _slot(self, bound: InFlight, key: str) -> Iterator[None]:
        busy = bound.enter(key)
        if busy is not None:
            raise TooManyConcurrent(busy.message, retry_after_s=BUSY_RETRY_S, details=busy.details())
        try:
            yield
        finally:
            bound.leave(key)

    @contextmanager
    def tenant_slot(self, tenant_id: str | None) -> Iterator[None]:
        """Hold one of the tenant's data-plane slots on this replica for a call, or refuse it with 429
        ``too_many_concurrent``. An admin's call (no tenant) is not counted."""
        if tenant_id is None:
            yield
            return
        with self._slot(self.calls, tenant_id):
            yield

    async def _address(self, host_id: str) -> str:
        try:
            snap = await self.view.get()
        except StoreUnavailable:
            last = self.view.last
            if last is None:
                raise
            snap = last
        rec = snap.records.get(host_id)
        if rec is None:
            snap = await self.view.get(fresh=True)
            rec = snap.records.get(host_id)
        return rec.address if rec is not None else ""

    async def remember(self, record: SandboxRecord) -> None:
        if record.host_id and record.state is SandboxState.RUNNING:
            self.locations.put(
                record.id,
                Location(record.tenant_id, record.host_id, await self._address(record.host_id), record.epoch),
            )

    async def get(self, sandbox_id: str, tenant_id: str | None) -> SandboxRecord:
        rec = await self.store.get_sandbox(sandbox_id, tenant_id=tenant_id)
        if rec is None or rec.state is SandboxState.DELETED:
            raise ResourceNotFound(f"no sandbox {sandbox_id}")
        return rec

    async def disk_used_mb(self, record: SandboxRecord) -> int | None:
        """What a running image sandbox's disk holds, asked of its host now; None for a sandbox
        without a disk of its own, and when its host does not answer within ``DISK_USED_WAIT_S``
        (the record is still shown)."""
        if record.image is None or record.state is not SandboxState.RUNNING or record.host_id is None:
            return None
        try:
            client = self.agents.client(record.host_id, await self._address(record.host_id))
            info = await asyncio.wait_for(client.get(record.id), DISK_USED_WAIT_S)
        except (AgentError, StoreUnavailable, TimeoutError):
            return None
        return info.disk_used_mb

    async def list(
        self,
        tenant_id: str | None,
        *,
        state: SandboxState | None,
        host_id: str | None,
        limit: int,
        cursor: str | None,
        newest_first: bool = False,
    ) -> Page:
        return await self.store.list_sandboxes(
            tenant_id=tenant_id,
            host_id=host_id,
            state=state,
            limit=limit,
            cursor=cursor,
            newest_first=newest_first,
        )

    async def _locate(self, sandbox_id: str, tenant_id: str | None) -> Location:
        """From the store when it answers; from this replica's memory when it does not."""
        try:
            rec = await self.get(sandbox_id, tenant_id)
        except StoreUnavailable:
            loc = self.locations.get(sandbox_id)
            if loc is None or (tenant_id is not None and loc.tenant_id != tenant_id):
                raise
            return loc
        if rec.state is SandboxState.ORPHANED:
            raise Gone(f"sandbox {sandbox_id}'s host is gone; it is orphaned until the host returns")
        if rec.state is not SandboxState.RUNNING or rec.host_id is None:
            # Recreating: its new copy is not started yet, and its old one is never called.
            raise NotRunning(f"sandbox {sandbox_id} is {rec.state.value}")
        loc = Location(rec.tenant_id, rec.host_id, await self._address(rec.host_id), rec.epoch)
        self.locations.put(sandbox_id, loc)
        return loc

    async def exec(self, sandbox_id: str, tenant_id: str | None, req: ExecRequest) -> ExecResult:
        # Counted before the store is read: a refused call costs this replica next to nothing.
        with self._exec_slots(sandbox_id, tenant_id):
            loc = await self._locate(sandbox_id, tenant_id)
            with _agent_errors(sandbox_id, loc):
                return await self.agents.client(loc.host_id, loc.address).exec(sandbox_id, req, loc.epoch)

    async def exec_stream(self, sandbox_id: str, tenant_id: str | None, req: ExecRequest) -> ExecEvents:
        """A command whose output comes as it is written. The slots it holds are handed back, and the
        command killed if it still runs, when the stream is closed (its caller gone)."""
        slots = contextlib.ExitStack()
        slots.enter_context(self._exec_slots(sandbox_id, tenant_id))
        try:
            loc = await self._locate(sandbox_id, tenant_id)
            with _agent_errors(sandbox_id, loc):
                stream = await self.agents.client(loc.host_id, loc.address).exec_stream(
                    sandbox_id, req, loc.epoch
                )
        except BaseException:
            slots.close()
            raise
        return _Held(stream, slots)

    # -- background commands: started by one call, running on after it (corral.agent.commands) -------

    async def start_command(self, sandbox_id: str, tenant_id: str | None, req: ExecRequest) -> CommandInfo:
        """Start a command that keeps running after this call; its host holds it (and one of the
        sandbox's command slots) until it ends, and any replica reaches it there by its pid."""
        with self._exec_slots(sandbox_id, tenant_id):
            loc = await self._locate(sandbox_id, tenant_id)
            with _agent_errors(sandbox_id, loc):
                return await self._agent(loc).start_command(sandbox_id, req, loc.epoch)

    async def list_commands(self, sandbox_id: str, tenant_id: str | None) -> CommandList:
        loc = await self._locate(sandbox_id, tenant_id)
        with _agent_errors(sandbox_id, loc):
            return await self._agent(loc).list_commands(sandbox_id, loc.epoch)

    async def command(
        self, sandbox_id: str, tenant_id: str | None, pid: int, wait_s: float = 0.0
    ) -> CommandInfo:
        """Its state; with ``wait_s``, once it has ended or after that long (a call that waits holds
        one of the tenant's data-plane slots here meanwhile)."""
        with self.tenant_slot(tenant_id) if wait_s > 0 else contextlib.nullcontext():
            loc = await self._locate(sandbox_id, tenant_id)
            with _agent_errors(sandbox_id, loc):
                return await self._agent(loc).command(sandbox_id, pid, loc.epoch, wait_s)

    async def command_output(self, sandbox_id: str, tenant_id: str | None, pid: int) -> CommandOutput:
        loc = await self._locate(sandbox_id, tenant_id)
        with _agent_errors(sandbox_id, loc):
            return await self._agent(loc).command_output(sandbox_id, pid, loc.epoch)

    async def follow_command(self, sandbox_id: str, tenant_id: str | None, pid: int) -> ExecEvents:
        """Its output as it comes until it ends. Closing the stream (its reader gone) hands back the
        tenant's slot it holds here and stops the following, never the command."""
        slots = contextlib.ExitStack()
        slots.enter_context(self.tenant_slot(tenant_id))
        try:
            loc = await self._locate(sandbox_id, tenant_id)
            with _agent_errors(sandbox_id, loc):
                stream = await self._agent(loc).follow_command(sandbox_id, pid, loc.epoch)
        except BaseException:
            slots.close()
            raise
        return _Held(stream, slots)

    async def kill_command(self, sandbox_id: str, tenant_id: str | None, pid: int) -> CommandInfo:
        loc = await self._locate(sandbox_id, tenant_id)
        with _agent_errors(sandbox_id, loc):
            return await self._agent(loc).kill_command(sandbox_id, pid, loc.epoch)

    def _agent(self, loc: Location) -> AgentClient:
        return self.agents.client(loc.host_id, loc.address)

    @contextmanager
    def _exec_slots(self, sandbox_id: str, tenant_id: str | None) -> Iterator[None]:
        with self.tenant_slot(tenant_id):
            if tenant_id is None or self.sandbox_calls is None:
                yield
                return
            with self._slot(self.sandbox_calls, f"{tenant_id}/{sandbox_id}"):
                yield

    async def set_network(
        self, sandbox_id: str, tenant_id: str | None, policy: EgressPolicy, *, keep_public: bool = True
    ) -> SandboxRecord:
        """Replace a running sandbox's egress policy: on its host first (atomically there), then on
        its record, so the record never names a policy its host refused. ``keep_public``: the
        sandbox keeps whether its ports need its traffic token (E2B's updates do not say)."""
        if keep_public and policy.attached:
            policy = dataclasses.replace(
                policy, public=network.policy_of(await self.get(sandbox_id, tenant_id)).public
            )
        loc = await self._locate(sandbox_id, tenant_id)
        try:
            body = EgressPolicyBody.of(policy)
            await self.agents.client(loc.host_id, loc.address).set_egress(sandbox_id, body, loc.epoch)
        except AgentError as e:
            raise network.agent_failure(sandbox_id, loc.host_id, e) from e
        return await self.store.set_sandbox_network(sandbox_id, network.network_text(policy))

    async def delete(
        self, sandbox_id: str, tenant_id: str | None, *, forget_idempotency: bool = False
    ) -> None:
        """``forget_idempotency``: the create that made it is refused after all (its template's ready
        check failed), so its Idempotency-Key, retried, creates anew."""
        rec = await self.get(sandbox_id, tenant_id)
        if rec.state is SandboxState.RESERVED:
            # Still being placed: a tombstone (the leader removes it), not a removal, so the create
            # binding it learns it was deleted rather than resolved as never made.
            try:
                await self.store.set_sandbox_state(
                    sandbox_id, SandboxState.DELETED, expect=SandboxState.RESERVED
                )
                self.locations.drop(sandbox_id)
                return
            except StateConflict:
                rec = await self.get(sandbox_id, tenant_id)  # placed meanwhile: deleted as placed
        if rec.host_id and rec.state not in GONE_STATES:
            try:
                client = self.agents.client(rec.host_id, await self._address(rec.host_id))
                await client.stop(sandbox_id, rec.epoch)
            except AgentSandboxNotFound:
                pass
            except AgentError:
                # The host cannot be told now: leave a tombstone the reconciler finishes later.
                await self.store.set_sandbox_state(sandbox_id, SandboxState.DELETED)
                self.locations.drop(sandbox_id)
                return
        await self.store.delete_sandbox(sandbox_id, forget_idempotency=forget_idempotency)
        self.locations.drop(sandbox_id)
        if rec.reservation_id:
            # Deleted before a heartbeat showed it: no heartbeat ever will, so end its claim now.
            await self.store.cancel(rec.reservation_id)


@contextmanager
def _agent_errors(sandbox_id: str, loc: Location) -> Iterator[None]:
    """An agent's refusal of a command, as the API answers it."""
    try:
        yield
    except AgentBusy as e:
        raise TooManyConcurrent(e.message, retry_after_s=e.retry_after_s, details=e.details) from e
    except AgentCommandNotFound as e:
        raise ResourceNotFound(f"no command {e.details.get('pid')} in sandbox {sandbox_id}") from e
    except AgentSandboxNotFound as e:
        raise ResourceNotFound(f"sandbox {sandbox_id} is not running on its host") from e
    except AgentUnavailable as e:
        raise Unavailable(
            f"host {loc.host_id} is unreachable", code=ErrorCode.HOST_UNREACHABLE, retry_after_s=2
        ) from e
    except AgentInvalid as e:
        # The host's runtime refused the input itself (what execve would refuse): the caller's.
        raise InvalidRequest(str(e.details.get("field", "body")), e.message) from e
    except AgentConflict as e:
        if e.code != ErrorCode.SANDBOX_PAUSED:
            raise BadGateway(e.message, code=e.code) from e
        # Auto-resume (a sandbox created to wake on use) belongs here: resume, then exec again.
        raise SandboxIsPaused(e.message) from e
    except AgentError as e:
        raise BadGateway(e.message, code=e.code) from e


class _Held:
    """A streamed command and the replica's slots it holds, handed back when it is closed."""

    def __init__(self, stream: ExecEvents, slots: contextlib.ExitStack) -> None:
        self._stream = stream
        self._slots = slots

    def events(self) -> AsyncIterator[ExecEvent | None]:
        return self._stream.events()

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._slots.close()
