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
from corral.control.ports import AgentLookup, ReconcilePort
from corral.control.retry import RetryAfter
from corral.control.routes import RouteCache
from corral.control.view import ViewCache
from corral.core import Clock
from corral.store import ListingChange, SandboxRecord, SandboxState, StoreError, disputed

log = logging.getLogger("corral.reconcile")

LEADER_LEASE = "reconciler"
# Listing changes are read again this far back: a heartbeat's transaction stamps its rows when it
# starts and may commit a little later than a sweep that began in between.
LISTING_OVERLAP_S = 5.0
# How long an entry that went out of a listing is kept for the sweeps to see.
LISTING_KEEP_S = 300.0
# How long a repeated Idempotency-Key returns the first create's sandbox (E2B and Stripe keep a day).
IDEMPOTENCY_KEY_TTL_S = 24 * 3600.0


class Reconciler:
    def __init__(
        self,
        store: ReconcilePort,
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
        # Running sandboxes their host's listing lacked, with that listing's heartbeat seq.
        self._lost: dict[str, int] = {}
        # Listing entries to compare with their records, (host, id): those that changed, kept until
        # they agree or are acted on. Read from the changes since ``_listings_since`` (None: a new
        # leader, which reads every entry once).
        self._watch: set[tuple[str, str]] = set()
        self._listings_since: float | None = None
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
            self._listings_since = None  # whoever leads next starts from every entry
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
        if self._ticks % 10 == 1:
            self.metrics.fleet.committed_mb = await self.store.committed_mb()
        if self._ticks % 60 == 1:
            await self.store.purge_idempotency_keys(self.clock.now() - IDEMPOTENCY_KEY_TTL_S)
            await self.store.prune_listings(self.clock.now() - LISTING_KEEP_S)

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
        by_host: dict[str, list[SandboxRecord]] = {}
        for sb in page.items:
            by_host.setdefault(sb.host_id or "", []).append(sb)
        for host_id, orphans in by_host.items():
            host = snap.records.get(host_id)
            if (
                host is None
                or host.listed_seq is None
                or now - host.heartbeat_at > self.config.timeouts.stale_after_s
            ):
                continue
            listed = await self.store.listed(host_id, [sb.id for sb in orphans])
            for sb in orphans:
                if sb.id in listed:
                    # At the version read: an orphan given another host or epoch since is not reclaimed.
                    with contextlib.suppress(StoreError):
                        await self.store.set_sandbox_state(
                            sb.id,
                            SandboxState.RUNNING,
                            expect=SandboxState.ORPHANED,
                            expect_version=sb.version,
                        )
                elif host.listed_at > sb.updated_at:
                    gone[sb.id] = host.listed_seq
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
        owners: dict[str, str] | None = None
        for sb in page.items:
            if sb.updated_at > cutoff:
                continue  # its create may still be binding
            owners = (
                owners if owners is not None else await self.store.listed_hosts([s.id for s in page.items])
            )
            owner = owners.get(sb.id)
            with contextlib.suppress(StoreError):
                if owner is not None:
                    await self.store.set_sandbox_state(
                        sb.id, SandboxState.RUNNING, expect=SandboxState.RESERVED, host_id=owner
                    )
                else:
                    # The create never happened: a retry with its Idempotency-Key must create anew.
                    await self.store.delete_sandbox(sb.id, forget_idempotency=True)

    async def _stop_strays(self) -> None:
        """Compare what hosts list with what the records say, for the listing entries that changed
        since the last sweep (and those still under watch): never every record. Both differences
        must be seen twice before anything is done (a create binding right now differs for an
        instant): a sandbox no record claims is stopped; a record whose sandbox its host no longer
        lists (it died, or the host was restarted without it) is marked ``stopped``."""
        started = self.clock.now()
        since = 0.0 if self._listings_since is None else self._listings_since - LISTING_OVERLAP_S
        # Only entries a record disputes: a fleet creating fast changes thousands of entries between
        # sweeps, and reading each one's record back here would stall every request meanwhile.
        self._watch.update((c.host_id, c.sandbox_id) for c in await self.store.listing_disputes(since))
        self._listings_since = started
        if not self._watch:
            self._strays, self._lost = set(), {}
            return
        snap = await self.view.get(fresh=True)
        stale_after = self.config.timeouts.stale_after_s
        records = await self.store.get_sandboxes({sid for _, sid in self._watch})
        by_host: dict[str, list[str]] = {}
        for host_id, sid in self._watch:
            by_host.setdefault(host_id, []).append(sid)
        strays: set[tuple[str, str]] = set()
        lost: dict[str, int] = {}  # sandbox -> the seq of the listing that lacked it
        watch: set[tuple[str, str]] = set()
        for host_id, sids in by_host.items():
            host = snap.records.get(host_id)
            if host is None:
                continue  # the host is gone: so is its listing
            if host.listed_seq is None or started - host.heartbeat_at > stale_after:
                # A silent host is the dead-host path's business; an untrusted listing waits for the
                # whole set.
                watch.update((host_id, sid) for sid in sids)
                continue
            listed = await self.store.listed(host_id, sids)
            for sid in sids:
                rec = records.get(sid)
                if not disputed(ListingChange(host_id, sid, sid in listed, started), rec):
                    continue
                watch.add((host_id, sid))
                if sid in listed:
                    strays.add((host_id, sid))
                elif rec is not None and host.listed_at > rec.updated_at:
                    lost[sid] = host.listed_seq
        for host_id, sid in strays & self._strays:
            log.warning("stopping stray sandbox %s on %s: no record claims it", sid, host_id)
            await self._stop(host_id, sid)
            watch.discard((host_id, sid))
        # Lost only when two different listings, both received after the sandbox was placed, lack
        # it: one built just before its start (and received just after) would lack it too, and two
        # rounds can read that same listing when they come faster than heartbeats do.
        confirmed = {sid for sid, seq in lost.items() if sid in self._lost and seq > self._lost[sid]}
        for sid in confirmed:
            log.warning("sandbox %s is no longer running on its host; marking it stopped", sid)
            with contextlib.suppress(StoreError):
                await self.store.set_sandbox_state(sid, SandboxState.STOPPED, expect=SandboxState.RUNNING)
            self.routes.drop(sid)
        self._watch = {(h, sid) for h, sid in watch if sid not in confirmed}
        self._strays = strays - self._strays
        self._lost = {sid: self._lost.get(sid, seq) for sid, seq in lost.items() if sid not in confirmed}

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
