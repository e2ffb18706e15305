"""Background work that keeps the books honest. Every replica renews its own lease; one leader (a
store lease) ends lapsed replicas' and expired reservations, reaps sandboxes past their TTL, orphans
the sandboxes of dead hosts and recreates those that asked for it elsewhere (never deleting a
placement), and reclaims orphans when their host returns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from corral.agent.errors import AgentError, AgentSandboxNotFound
from corral.control import lifecycle
from corral.control.config import ControlConfig
from corral.control.failover import Failover
from corral.control.locations import LocationCache
from corral.control.metrics import Metrics
from corral.control.ports import AgentLookup, ReconcilePort
from corral.control.retry import RetryAfter
from corral.control.view import ViewCache
from corral.core import Clock
from corral.core.lifecycle import ON_TIMEOUT_PAUSE, Lifecycle
from corral.store import (
    ListingChange,
    RecordNotFound,
    SandboxRecord,
    SandboxState,
    StateConflict,
    StoreError,
    disputed,
)

log = logging.getLogger("corral.reconcile")

LEADER_LEASE = "reconciler"
# Listing changes are read again this far back: a heartbeat's transaction stamps its rows when it
# starts and may commit a little later than a sweep that began in between.
LISTING_OVERLAP_S = 5.0
# How long an entry that went out of a listing is kept for the sweeps to see.
LISTING_KEEP_S = 300.0
# How long a repeated Idempotency-Key returns the first create's sandbox (E2B and Stripe keep a day).
IDEMPOTENCY_KEY_TTL_S = 24 * 3600.0


@dataclass(eq=False, repr=False)
class Reconciler:
    store: ReconcilePort
    view: ViewCache
    agents: AgentLookup
    config: ControlConfig
    clock: Clock
    metrics: Metrics
    retry_after: RetryAfter
    locations: LocationCache
    failover: Failover
    is_leader: bool = field(default=False, init=False)
    # Until when (this replica's clock) the leader lease it last took or renewed holds.
    _lead_until: float = field(default=0.0, init=False)
    _ticks: int = field(default=0, init=False)
    # Sandboxes hosts run that no record claims, as of the previous sweep: (host, id).
    _strays: set[tuple[str, str]] = field(default_factory=set, init=False)
    # Running sandboxes their host's listing lacked, with that listing's heartbeat seq.
    _lost: dict[str, int] = field(default_factory=dict, init=False)
    # Listing entries to compare with their records, (host, id): those that changed, kept until
    # they agree or are acted on. Read from the changes since ``_listings_since`` (None: a new
    # leader, which reads every entry once).
    _watch: set[tuple[str, str]] = field(default_factory=set, init=False)
    _listings_since: float | None = field(default=None, init=False)
    # Orphans whose host came back without them, with the seq of the heartbeat that said so.
    _gone_orphans: dict[str, int] = field(default_factory=dict, init=False)
    # More rounds only the leader runs (warm-pool spreading), each after the books are settled.
    leader_work: list[Callable[[], Awaitable[object]]] = field(default_factory=list, init=False)
    # Rounds every replica runs after renewing its lease (reading its tenants' rates); each of them
    # never raises.
    replica_work: list[Callable[[], Awaitable[object]]] = field(default_factory=list, init=False)

    async def tick(self) -> None:
        """One round. Safe to call concurrently from several replicas."""
        cfg = self.config
        await self.store.renew_replica(cfg.replica_id, cfg.replica_lease_s)
        for work in self.replica_work:
            await work()
        snap = await self.view.get()
        self.metrics.fleet.hosts = list(snap.records.values())
        self.retry_after.next_reservation_expiry = await self.store.next_expiry()
        if not await self._lead():
            self._listings_since = None  # whoever leads next starts from every entry
            return
        n = self._ticks + 1
        steps: list[Callable[[], Awaitable[object]]] = [
            self.store.expire_replicas,
            self.store.sweep_expired,
            # Right after the lapsed replicas are known: their in-flight creates are resolved first.
            self._resolve_unbound,
            self._reap_expired,
            self.failover.fail_dead_hosts,
            self.failover.recreate_all,
            self._reclaim_orphans,
            self._finish_tombstones,
            *self.leader_work,
        ]
        if n % 5 == 0:
            steps.append(self._stop_strays)
        if n % 10 == 1:
            steps.append(self._count_committed)
        if n % 60 == 1:
            steps.append(self._purge)
        for step in steps:
            if not self.leads():
                # The lease may be another replica's by now: no step of this round may overlap its.
                log.warning("leader lease lost mid-round; the rest of the round is left to the next leader")
                self._listings_since = None
                return
            await step()
        self._ticks = n

    async def _lead(self) -> bool:
        """Take or renew the leader lease. A lease counts from before the call that took it: this
        replica's own clock then never says it leads longer than the store does."""
        cfg = self.config
        asked = self.clock.now()
        self.is_leader = await self.store.try_lead(LEADER_LEASE, cfg.replica_id, cfg.replica_lease_s)
        self._lead_until = max(self._lead_until, asked + cfg.replica_lease_s) if self.is_leader else 0.0
        return self.is_leader

    def leads(self) -> bool:
        """Whether this replica holds the leader lease now, as far as it knows."""
        return self.is_leader and self.clock.now() < self._lead_until

    async def _count_committed(self) -> None:
        self.metrics.fleet.committed_mb = await self.store.committed_mb()

    async def _purge(self) -> None:
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
                continue  # its create is still placing it (or left it: _resolve_unbound's business)
            life = Lifecycle.parse(sb.lifecycle)
            pauses = life.on_timeout == ON_TIMEOUT_PAUSE and sb.state is SandboxState.RUNNING
            if pauses and sb.host_id and await self._pause_expired(sb.host_id, sb, life.keep_memory):
                continue
            if sb.host_id and sb.state is SandboxState.RUNNING and not await self._stop(sb.host_id, sb.id):
                await self.store.set_sandbox_state(sb.id, SandboxState.DELETED)
                continue
            await self.store.delete_sandbox(sb.id)
            self.locations.drop(sb.id)

    async def _pause_expired(self, host_id: str, sb: SandboxRecord, memory: bool) -> bool:
        """A sandbox whose lifecycle pauses it at its timeout, paused. False: its host no longer has
        it (it ends as any expired sandbox does); a host that cannot be told now is asked again at the
        next round."""
        rec = (await self.view.get()).records.get(host_id)
        try:
            await lifecycle.pause(
                self.store, self.agents.client(host_id, rec.address if rec else ""), sb, memory=memory
            )
        except AgentSandboxNotFound:
            return False
        except (AgentError, StoreError) as exc:
            log.warning("sandbox %s reached its timeout and could not be paused yet: %s", sb.id, exc)
        return True

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
            self.locations.drop(sid)
        self._gone_orphans = {
            sid: self._gone_orphans.get(sid, seq) for sid, seq in gone.items() if sid not in ended
        }

    async def _finish_tombstones(self) -> None:
        page = await self.store.list_sandboxes(state=SandboxState.DELETED, limit=200)
        for sb in page.items:
            if not sb.host_id or await self._stop(sb.host_id, sb.id):
                await self.store.delete_sandbox(sb.id)

    async def _resolve_unbound(self) -> None:
        """Records left ``reserved`` by a create that died with its replica: as soon as that replica's
        lease has lapsed (the record names it), or, for a record naming none, once the longest create a
        live replica could make is over. If a host runs the sandbox, it is that host's; otherwise the
        create never happened and the record goes with its Idempotency-Key, so a retry creates anew."""
        page = await self.store.list_sandboxes(state=SandboxState.RESERVED, limit=500)
        if not page.items:
            return
        cutoff = self.clock.now() - self.config.create_deadline_s
        abandoned = await self.store.abandoned([sb.id for sb in page.items])
        due = [sb.id for sb in page.items if sb.id in abandoned or sb.updated_at <= cutoff]
        if not due:
            return
        hosts = await self.store.listed_hosts(due)
        for sid in due:
            host = hosts.get(sid)
            # Both only while it is still ``reserved``: a create that bound it meanwhile keeps it.
            with contextlib.suppress(StoreError):
                if host is not None:
                    await self.store.set_sandbox_state(
                        sid, SandboxState.RUNNING, expect=SandboxState.RESERVED, host_id=host
                    )
                else:
                    await self.store.delete_sandbox(
                        sid, forget_idempotency=True, expect=SandboxState.RESERVED
                    )

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
        stopped: set[tuple[str, str]] = set()
        for host_id, sid in strays & self._strays:
            log.warning("stopping stray sandbox %s on %s: no record claims it", sid, host_id)
            if await self._stop(host_id, sid):
                stopped.add((host_id, sid))
                watch.discard((host_id, sid))
        # Lost only when two different listings, both received after the sandbox was placed, lack
        # it: one built just before its start (and received just after) would lack it too, and two
        # rounds can read that same listing when they come faster than heartbeats do.
        confirmed = {sid for sid, seq in lost.items() if sid in self._lost and seq > self._lost[sid]}
        marked: set[str] = set()
        for sid in confirmed:
            log.warning("sandbox %s is no longer running on its host; marking it stopped", sid)
            try:
                await self.store.set_sandbox_state(sid, SandboxState.STOPPED, expect=SandboxState.RUNNING)
            except (StateConflict, RecordNotFound):
                pass  # its record moved on meanwhile: nothing left to correct
            except StoreError as exc:
                # Kept under watch, with its evidence: its listing entry will not change again, so
                # nothing but this sweep's memory brings it back to be marked.
                log.info("marking sandbox %s stopped failed; the next sweep tries again: %r", sid, exc)
                continue
            marked.add(sid)
            self.locations.drop(sid)
        # Only what was acted on is forgotten: a stop or a write that failed is tried again next sweep.
        self._watch = {(h, sid) for h, sid in watch if sid not in marked}
        self._strays = strays - stopped
        self._lost = {sid: self._lost.get(sid, seq) for sid, seq in lost.items() if sid not in marked}

    async def keep_lease(self) -> None:
        """Renew this replica's lease, and the leader lease while it leads, on their own schedule, not
        only as a round starts: a leader's round can outlast either (failover binding sandbox after
        sandbox). A live replica whose lease lapses has its in-flight reservations ended and its
        in-flight creates resolved under it; a leader whose lease lapses mid-round would share the rest
        of its round with the next leader."""
        cfg = self.config
        while True:
            try:
                await self.store.renew_replica(cfg.replica_id, cfg.replica_lease_s)
            except Exception as exc:
                log.info("lease renewal failed: %r", exc)
            if self.is_leader:
                try:
                    await self._lead()
                except Exception as exc:
                    log.info("leader lease renewal failed: %r", exc)
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
            # Awaited: a renewal still in flight must not land after the replica let its leases go.
            lease.cancel()
            await asyncio.gather(lease, return_exceptions=True)
