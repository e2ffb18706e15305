"""Failover, the leader's: a host silent past ``dead_after`` loses its sandboxes, recreate-policy ones
to another host under the same id, the rest to ``orphaned``.

The order, each step durable before the next, so a leader that dies anywhere leaves a state the next
leader finishes:

1. One transaction (:meth:`Store.fail_host`), only if the host is still silent: its recreate-policy
   sandboxes become ``recreating``, its other running ones ``orphaned``, its reservations released.
2. Per ``recreating`` sandbox, placement exactly as for a create; on the chosen host, with the
   reservation held, one conditional write gives the record that host and its epoch plus one, and
   fences every other host that may hold an older copy (its heartbeat reply tells it to stop it).
3. The new host starts it from its unsealed spec, at the new epoch; then ``running``.

A leader that dies after 2 leaves a ``recreating`` record naming a host: the next one starts it there
(a start already done answers as such) or, if that host cannot, places it again (a new epoch). No room
anywhere leaves it ``recreating``, retried every round, never dropped. Calls are routed only to the
record's host and epoch, and only once it is ``running``: at no moment are two copies routable.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from corral.agent.errors import AgentConflict, AgentError
from corral.codes import ErrorCode
from corral.control.errors import Unavailable
from corral.control.placement import Placement, Start
from corral.control.ports import FailoverPort
from corral.control.seal import Sealer, SealError, open_spec
from corral.control.view import ViewCache
from corral.core import Clock
from corral.core.timeouts import Timeouts
from corral.core.types import HostState
from corral.store import SandboxRecord, SandboxState, StateConflict, StoreError

log = logging.getLogger("corral.failover")

RECREATE_BATCH = 200


def reassignment_unfinished(rec: SandboxRecord) -> bool:
    """Whether a ``recreating`` record's last write was its reassignment (step 2), whose start is
    still to be done on the host it names. ``recreated_at`` alone does not say so: it outlives the
    recreate that set it, and a sandbox recreated once whose new host is then declared dead is
    ``recreating`` again naming that host, which its fence tells to stop the copy: it must be
    placed anew, not started there again at the epoch the fence ends."""
    return rec.recreated_at is not None and rec.updated_at <= rec.recreated_at


@dataclass(eq=False, repr=False)
class Failover:
    store: FailoverPort
    view: ViewCache
    placement: Placement
    sealer: Sealer | None
    clock: Clock
    timeouts: Timeouts
    # Run once a recreated sandbox's fresh copy has started: its template's start command
    # (readiness.py). Its failure is logged, never the recreate's.
    started: Callable[[SandboxRecord], Awaitable[object]] | None = None
    # Host -> the last heartbeat it was failed at: a host that stays dead is failed once, not
    # written to every round (a new leader does it once more, harmlessly).
    _failed: dict[str, float] = field(default_factory=dict, init=False)

    async def fail_dead_hosts(self) -> None:
        """Step 1 for every host silent past ``dead_after``."""
        now = self.clock.now()
        dead_before = now - self.timeouts.dead_after_s
        snap = await self.view.get()
        for host in snap.records.values():
            if host.heartbeat_at and host.heartbeat_at < dead_before:
                if self._failed.get(host.id) == host.heartbeat_at:
                    continue
                done = await self.store.fail_host(host.id, dead_before)
                self._failed[host.id] = host.heartbeat_at
                if done.orphaned or done.recreating:
                    log.warning(
                        "host %s is dead: %d sandboxes to recreate, %d orphaned, %d reservations released",
                        host.id,
                        done.recreating,
                        done.orphaned,
                        done.released,
                    )

    async def evacuate(self, host_id: str) -> int:
        """Drain with evacuation: the host's recreate-policy sandboxes go elsewhere by the same path."""
        done = await self.store.fail_host(host_id, float("-inf"), evacuate=True)
        return done.recreating

    async def recreate_all(self) -> None:
        """Steps 2 and 3 for every ``recreating`` sandbox."""
        page = await self.store.list_sandboxes(state=SandboxState.RECREATING, limit=RECREATE_BATCH)
        if not page.items:
            return
        snap = await self.view.get(fresh=True)
        now = self.clock.now()
        for rec in page.items:
            host = snap.records.get(rec.host_id or "")
            live = host is not None and now - host.heartbeat_at <= self.timeouts.stale_after_s
            try:
                # A reassignment a previous round (or leader) wrote: finish it on that host.
                resumable = reassignment_unfinished(rec) and live and host is not None
                if (
                    resumable
                    and host is not None
                    and host.state is HostState.READY
                    and await self._start_on(rec, rec.host_id or "", host.address)
                ):
                    continue
                await self._recreate(rec)
            except Unavailable as exc:
                log.info("sandbox %s waits for room to be recreated: %s", rec.id, exc.message)
            except (StoreError, AgentError, SealError) as exc:
                log.warning("recreating sandbox %s failed this round: %r", rec.id, exc)

    async def _start_on(self, rec: SandboxRecord, host_id: str, address: str) -> bool:
        spec = await open_spec(self.store, self.sealer, rec.id)
        try:
            await self.placement.binder.start(
                rec,
                host_id,
                address,
                spec.env,
                await self.placement.templates.pids(rec.template),
                spec.secrets,
                await self.placement.templates.image_config(rec),
            )
        except AgentConflict as exc:
            if exc.code != ErrorCode.SANDBOX_EXISTS:
                return False
            fresh = False  # a previous leader started it (and its start command, if it got that far)
        except AgentError:
            return False
        else:
            fresh = True
        with contextlib.suppress(StateConflict):
            await self.store.set_sandbox_state(
                rec.id, SandboxState.RUNNING, expect=SandboxState.RECREATING, expect_version=rec.version
            )
            if fresh:
                await self._started(rec)
        return True

    async def _started(self, rec: SandboxRecord) -> None:
        if self.started is None:
            return
        try:
            await self.started(rec)
        except Exception as exc:
            log.warning("recreated sandbox %s: its start command did not start: %r", rec.id, exc)

    async def _recreate(self, rec: SandboxRecord) -> None:
        """Placed as a create is; on the chosen host the record is reassigned (new host, epoch plus
        one, older copies fenced) before the new copy starts from its unsealed spec."""
        spec = await open_spec(self.store, self.sealer, rec.id)
        exclude = {rec.host_id} if rec.host_id else set()
        placed = await self.placement.place(Start.of(rec, spec), exclude)
        log.warning("sandbox %s recreated on %s (epoch %d)", rec.id, placed.host_id, placed.epoch)
        await self._started(placed)
