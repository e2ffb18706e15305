"""Background work that keeps the books honest. Every replica renews its own lease; one leader (a
store lease) ends lapsed replicas' and expired reservations, reaps sandboxes past their TTL, orphans
the sandboxes of dead hosts and recreates those that asked for it elsewhere (never deleting a
placement), and reclaims orphans when their host returns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from corral.agent.errors import AgentError, AgentSandboxNotFound
from corral.control.config import ControlConfig
from corral.control.failover import Failover
from corral.control.metrics import Metrics
from corral.control.ports import AgentLookup, ReconcileStore
from corral.control.retry import RetryAfter
from corral.control.routes import RouteCache
from corral.control.view import ViewCache
from corral.core import Clock
from corral.store import SandboxState, StoreError

log = logging.getLogger("corral.reconcile")

LEADER_LEASE = "reconciler"
# How long a repeated Idempotency-Key returns the first create's sandbox (E2B and Stripe keep a day).
IDEMPOTENCY_KEY_TTL_S = 24 * 3600.0


class Reconciler:
    def __init__(
        self,
        store: ReconcileStore,
        view: ViewCache,
        agents: AgentLookup,
        config: ControlConfig,
        clock: Clock,
        metrics: Metrics,
        retry_after: RetryAfter,
        routes: RouteCache,
        failover: Failover,
    ) -> None:
        self.store = store
        self.view = view
        self.agents = agents
        self.config = config
        self.clock = clock
        self.metrics = metrics
        self.retry_after = retry_after
        self.routes = routes
        self.failover = failover
        self.is_leader = False
        self._ticks = 0
        # Sandboxes hosts run that no record claims, as of the previous sweep: (host, id).
        self._strays: set[tuple[str, str]] = set()
        # Records said to be running that their host did not list, as of the previous sweep.
        # Running sandboxes their host's heartbeat lacked, with that heartbeat's seq.
        self._lost: dict[str, int] = {}
        # Orphans whose host came back without them, with the seq of the heartbeat that said so.
        self._gone_orphans: dict[str, int] = {}
        # More rounds only the leader runs (warm-pool spreading), each after the books are settled.
        self.leader_work: list[Callable[[], Awaitable[object]]] = []

    async def tick(self) -> None:
        """One round. Safe to call concurrently from several replicas."""
        cfg = self.config
        await self.store.renew_replica(cfg.replica_id, cfg.replica_lease_s)
        snap = await self.view.get()
        self.metrics.fleet.hosts = list(snap.records.values())
        self.retry_after.next_reservation_expiry = await self.store.next_expiry()
        self.is_leader = await self.store.try_lead(LEADER_LEASE, cfg.replica_id, cfg.replica_lease_s)
        if not self.is_leader:
            return
        await self.store.expire_replicas()
        await self.store.sweep_expired()
        await self._reap_expired()
        await self.failover.fail_dead_hosts()
        await self.failover.recreate_all()
        await self._reclaim_orphans()
        await self._finish_tombstones()
        await self._settle_unbound()
        for work in self.leader_work:
            await work()
        self._ticks += 1
        if self._ticks % 5 == 0:
            await self._stop_strays()
        if self._ticks % 10 == 1:  # a full read of running sandboxes: not every round
            await self._committed_total()
        if self._ticks % 60 == 1:
            await self.store.purge_idempotency_keys(self.clock.now() - IDEMPOTENCY_KEY_TTL_S)

    async def _stop(self, host_id: str, sandbox_id: str) -> bool:
        snap = await self.view.get()
        rec = snap.records.get(host_id)
        try:
            await self.agents.client(host_id, rec.address if rec else "").stop(sandbox_id)
        except AgentSandboxNotFound:
            return True
        except AgentError:
            return False
        return True

    async def _reap_expired(self) -> None:
        for sb in await self.store.expired_sandboxes():
            if sb.state is SandboxState.RESERVED:
                continue  # its create is still placing it (or left it: _settle_unbound's business)
            if sb.host_id and sb.state is SandboxState.RUNNING and not await self._stop(sb.host_id, sb.id):
                await self.store.set_sandbox_state(sb.id, SandboxState.DELETED)
                continue
            await self.store.delete_sandbox(sb.id)
            self.routes.drop(sb.id)

    async def _reclaim_orphans(self) -> None:
        page = await self.store.list_sandboxes(state=SandboxState.ORPHANED, limit=1000)
        if not page.items:
            self._gone_orphans = {}
            return
        snap = await self.view.get(fresh=True)
        now = self.clock.now()
        gone: dict[str, int] = {}
        for sb in page.items:
            host = snap.records.get(sb.host_id or "")
            if host is None or now - host.heartbeat_at > self.config.timeouts.stale_after_s:
                continue
            if sb.id in host.sandbox_ids:
                # At the version read: an orphan given another host or epoch since is not reclaimed.
                with contextlib.suppress(StoreError):
                    await self.store.set_sandbox_state(
                        sb.id, SandboxState.RUNNING, expect=SandboxState.ORPHANED, expect_version=sb.version
                    )
            elif host.heartbeat_at > sb.updated_at:
                gone[sb.id] = host.seq
        # Its host is back and two different heartbeats since it was orphaned lack it: the sandbox
        # died with the host. It ends.
        ended = {
            sid for sid, seq in gone.items() if sid in self._gone_orphans and seq > self._gone_orphans[sid]
        }
        for sid in ended:
            log.warning("orphan %s did not come back with its host; marking it stopped", sid)
            with contextlib.suppress(StoreError):
                await self.store.set_sandbox_state(sid, SandboxState.STOPPED, expect=SandboxState.ORPHANED)
            self.routes.drop(sid)
        self._gone_orphans = {
            sid: self._gone_orphans.get(sid, seq) for sid, seq in gone.items() if sid not in ended
        }

    async def _finish_tombstones(self) -> None:
        page = await self.store.list_sandboxes(state=SandboxState.DELETED, limit=200)
        for sb in page.items:
            if not sb.host_id or await self._stop(sb.host_id, sb.id):
                await self.store.delete_sandbox(sb.id)

    async def _settle_unbound(self) -> None:
        """Records left ``reserved`` by a replica that died between reserve and bind. If a host runs
        the sandbox, it is that host's; otherwise the create never happened and the record goes."""
        page = await self.store.list_sandboxes(state=SandboxState.RESERVED, limit=500)
        if not page.items:
            return
        cutoff = self.clock.now() - self.config.create_deadline_s
        snap = None
        for sb in page.items:
            if sb.updated_at > cutoff:
                continue  # its create may still be binding
            snap = snap or await self.view.get(fresh=True)
            owner = next((h.id for h in snap.records.values() if sb.id in h.sandbox_ids), None)
            with contextlib.suppress(StoreError):
                if owner is not None:
                    await self.store.set_sandbox_state(
                        sb.id, SandboxState.RUNNING, expect=SandboxState.RESERVED, host_id=owner
                    )
                else:
                    # The create never happened: a retry with its Idempotency-Key must create anew.
                    await self.store.delete_sandbox(sb.id, forget_idempotency=True)

    async def _stop_strays(self) -> None:
        """Compare what each live host runs with what the records say it runs. Both differences must
        be seen twice in a row before anything is done (a create binding right now differs for an
        instant): a sandbox no record places on that host is stopped; a record whose sandbox its host no longer
        runs (it died, or the host was restarted without it) is marked ``stopped``."""
        snap = await self.view.get(fresh=True)
        now = self.clock.now()
        stale_after = self.config.timeouts.stale_after_s
        strays: set[tuple[str, str]] = set()
        lost: dict[str, int] = {}  # sandbox -> the seq of its host's heartbeat that lacked it
        for host in snap.records.values():
            if now - host.heartbeat_at > stale_after:
                continue  # a silent host is the dead-host path's business, not this one's
            known: set[str] = set()
            cursor = None
            while True:
                page = await self.store.list_sandboxes(host_id=host.id, limit=1000, cursor=cursor)
                for sb in page.items:
                    known.add(sb.id)
                    if (
                        sb.state is SandboxState.RUNNING
                        and sb.id not in host.sandbox_ids
                        and host.heartbeat_at > sb.updated_at
                    ):
                        lost[sb.id] = host.seq
                cursor = page.next_cursor
                if cursor is None:
                    break
            for sid in host.sandbox_ids - known:
                # No record claims it here: none at all, or one placed on another host (a start whose
                # reply was lost, tried again elsewhere). A record still being placed claims no host.
                rec = await self.store.get_sandbox(sid)
                if rec is None or (rec.host_id is not None and rec.state is not SandboxState.RESERVED):
                    strays.add((host.id, sid))
        for host_id, sid in strays & self._strays:
            log.warning("stopping stray sandbox %s on %s: no record claims it", sid, host_id)
            await self._stop(host_id, sid)
        # Lost only when two different heartbeats, both received after the sandbox was placed, lack
        # it: one built just before its start (and received just after) would lack it too, and two
        # rounds can read that same heartbeat when they come faster than heartbeats do.
        confirmed = {sid for sid, seq in lost.items() if sid in self._lost and seq > self._lost[sid]}
        for sid in confirmed:
            log.warning("sandbox %s is no longer running on its host; marking it stopped", sid)
            with contextlib.suppress(StoreError):
                await self.store.set_sandbox_state(sid, SandboxState.STOPPED, expect=SandboxState.RUNNING)
            self.routes.drop(sid)
        self._strays = strays - self._strays
        self._lost = {sid: self._lost.get(sid, seq) for sid, seq in lost.items() if sid not in confirmed}

    async def _committed_total(self) -> None:
        total = 0
        cursor = None
        while True:
            page = await self.store.list_sandboxes(state=SandboxState.RUNNING, limit=1000, cursor=cursor)
            total += sum(s.memory_mb for s in page.items)
            cursor = page.next_cursor
            if cursor is None:
                break
        self.metrics.fleet.committed_mb = total

    async def keep_lease(self) -> None:
        """Renew this replica's lease on its own schedule, not only as a round starts: a leader's round
        can outlast the lease (failover binding sandbox after sandbox), and a live replica whose lease
        lapses has its in-flight reservations ended under it, and its next ones covered by no lease."""
        cfg = self.config
        while True:
            try:
                await self.store.renew_replica(cfg.replica_id, cfg.replica_lease_s)
            except Exception as exc:
                log.info("lease renewal failed: %r", exc)
            await asyncio.sleep(cfg.reconcile_interval_s)

    async def run(self) -> None:
        lease = asyncio.get_running_loop().create_task(self.keep_lease())
        try:
            while True:
                try:
                    await self.tick()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.warning("reconcile round failed", exc_info=True)
                await asyncio.sleep(self.config.reconcile_interval_s)
        finally:
            lease.cancel()
