"""One control-plane replica: the store, the view, the agents, the create flow and the reconciler,
wired together. The API is a thin skin over this object; tests drive it directly. Every replica is
built by :func:`build_replica`: ``corral serve``, ``corral api``, the tests' cluster and the simulator
run the same wiring, on the clock, store and agents each of them brings."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from dataclasses import dataclass
from typing import TypeVar, cast

from corral.agent.protocol import AgentHeartbeat, HeartbeatReply
from corral.clock import SystemClock
from corral.codes import ErrorCode
from corral.control.agents import AgentDirectory
from corral.control.batch import BatchCreate
from corral.control.config import ControlConfig
from corral.control.create import CreateFlow
from corral.control.errors import (
    Conflict,
    Forbidden,
    HostInUse,
    ResourceNotFound,
    TenantInUse,
    Unauthorized,
    Unavailable,
)
from corral.control.failover import Failover
from corral.control.heartbeats import HeartbeatIntake
from corral.control.images import ImageBlobs
from corral.control.locations import LocationCache
from corral.control.metrics import Metrics
from corral.control.placement import Placement
from corral.control.pools import PoolBook, Pools, WarmClaims, WarmMetrics
from corral.control.rates import TenantRates
from corral.control.readiness import Readiness
from corral.control.reconcile import Reconciler
from corral.control.retry import RetryAfter
from corral.control.sandboxes import Sandboxes
from corral.control.seal import Sealer
from corral.control.templates import Templates
from corral.control.view import ViewCache
from corral.control.waiting import WaitingCreates
from corral.core import Clock
from corral.images import BlobStore
from corral.images.gc import ImageCollector
from corral.shapes.hosts import HostCredentials
from corral.store import (
    DEFAULT_MAX_CPUS,
    UNSET,
    HeartbeatResult,
    HostHasSandboxes,
    HostRecord,
    NameConflict,
    Principal,
    RecordNotFound,
    Role,
    SandboxState,
    Store,
    StoreUnavailable,
    TemplateRecord,
    TenantHasSandboxes,
    TenantRecord,
    TokenRecord,
    own_blobs,
)

T = TypeVar("T")

DEFAULT_TENANT = "default"
# How long a resolved token is trusted without asking the store again, unless a revocation comes first.
TOKEN_CACHE_S = 10.0
# How often a replica reads the store's revocation epoch: a token revoked anywhere stops working on
# every replica within this long (plus one store read). One read per replica per interval, however
# many tokens are in use.
REVOCATION_POLL_S = 1.0
# Where ``corral serve`` records the admin token it was configured with.
SERVE_TOKEN_SOURCE = "serve"


@dataclass(frozen=True, slots=True)
class HostStatus:
    record: HostRecord
    heartbeat_age_s: float


class ControlPlane:
    def __init__(
        self,
        store: Store,
        agents: AgentDirectory,
        config: ControlConfig | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        sealer: Sealer | None = None,
        blobs: BlobStore | None = None,
    ) -> None:
        self.store = store
        self.agents = agents
        self.config = config or ControlConfig()
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        t = self.config.timeouts
        self.metrics = Metrics()
        self.view = ViewCache(store, self.clock, t.view_ttl_s, t.heartbeat_interval_s)
        self.retry_after = RetryAfter(
            self.clock, t, self.config.retry_after_min_s, self.config.retry_after_max_s
        )
        self.locations = LocationCache()
        # The create path, each part built with what it uses: templates, placement, warm claims,
        # parked creates, then the create flow and batch over them.
        self.templates = Templates(store, self.clock)
        self.placement = Placement(
            store,
            self.view,
            agents,
            self.templates,
            self.config,
            self.clock,
            self.rng,
            self.metrics,
            self.retry_after,
        )
        self.pool_book = PoolBook(store, self.clock)
        self.warm = WarmClaims(
            store,
            self.view,
            agents,
            self.pool_book,
            self.clock,
            self.rng,
            t.stale_after_s,
            WarmMetrics(self.metrics.registry),
        )
        self.waiting = WaitingCreates(store, self.placement, sealer, self.clock, self.config, self.metrics)
        self.rates = TenantRates(store, self.clock, self.config, self.metrics)
        self.creates = CreateFlow(
            store,
            self.view,
            self.placement,
            self.templates,
            self.config,
            self.clock,
            self.metrics,
            warm=self.warm,
            sealer=sealer,
            waiting=self.waiting,
            rates=self.rates,
        )
        self.batches = BatchCreate(self.creates, self.placement)
        self.sandboxes = Sandboxes(
            store,
            self.view,
            agents,
            self.locations,
            self.config.max_execs_per_tenant,
            self.config.max_execs_per_sandbox,
        )
        ready = Readiness(self.sandboxes, self.templates, self.config.ready_timeout_s)
        self.creates.ready = ready
        self.heartbeats = HeartbeatIntake(store, self.metrics)
        self.images = ImageBlobs(blobs)
        # The leader collects the images no template and no sandbox names (a rebuild's old version
        # once its last sandbox is gone).
        self.image_gc = (
            ImageCollector(blobs, store.images_in_use, self.clock.now) if blobs is not None else None
        )
        self.failover = Failover(store, self.view, self.placement, sealer, self.clock, t, started=ready.start)
        self.reconciler = Reconciler(
            store,
            self.view,
            agents,
            self.config,
            self.clock,
            self.metrics,
            self.retry_after,
            self.locations,
            self.failover,
        )
        self.pools = Pools(
            store,
            self.view,
            self.pool_book,
            self.warm,
            self.clock,
            self.rng,
            t.stale_after_s,
            self.config.policy,
        )
        self.reconciler.replica_work.append(self.rates.refresh)
        self.reconciler.leader_work.append(self.pools.rebalance)
        self.reconciler.leader_work.append(self.waiting.place_waiting)
        if self.image_gc is not None:
            self.reconciler.leader_work.append(self.image_gc.tick)
        self._task: asyncio.Task[None] | None = None
        self.migrated = False
        self.default_tenant_id: str | None = None
        self._tokens: dict[bytes, tuple[Principal, float]] = {}
        self._epoch: int | None = None
        self._epoch_read_at = float("-inf")
        # A fleet-wide agent token (development only) may heartbeat as any host.
        self.shared_agent_token = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(
        self,
        *,
        admin_token: str | None = None,
        agent_token: str | None = None,
        replace_admin_token: bool = False,
    ) -> None:
        """``replace_admin_token``: the configured admin token is the only one this server adopts
        (``corral serve``): one it adopted before is revoked. Replicas leave that to an operator, so a
        rolling restart never locks replicas out of each other."""
        await self.store.migrate()
        self.migrated = True
        tenant = await self._ensure_tenant(DEFAULT_TENANT)
        self.default_tenant_id = tenant.id
        if admin_token:
            if replace_admin_token:
                await self.store.adopt_token(admin_token, tenant.id, Role.ADMIN, source=SERVE_TOKEN_SOURCE)
            else:
                await self.store.ensure_token(admin_token, tenant.id, Role.ADMIN)
        if agent_token:
            await self.store.ensure_token(agent_token, None, Role.AGENT)
            self.shared_agent_token = True
        await self.store.renew_replica(self.config.replica_id, self.config.replica_lease_s)
        await self.rates.refresh()
        self._task = asyncio.create_task(self.reconciler.run(), name="corral-reconciler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(Exception):
            await self.store.release_replica(self.config.replica_id)
            await self.store.resign("reconciler", self.config.replica_id)
        await self.agents.aclose()

    async def _ensure_tenant(self, name: str) -> TenantRecord:
        existing = await self.store.get_tenant_by_name(name)
        if existing is not None:
            return existing
        try:
            return await self.store.create_tenant(
                name,
                max_sandboxes=self.config.default_max_sandboxes,
                max_memory_mb=self.config.default_max_memory_mb,
                max_cpus=self.config.default_max_cpus,
            )
        except NameConflict:  # another replica created it first
            again = await self.store.get_tenant_by_name(name)
            assert again is not None
            return again

    async def ready(self) -> None:
        if not self.migrated:
            raise Unavailable("migrations not applied", code=ErrorCode.STORE_UNAVAILABLE, retry_after_s=1)
        await self.store.ping()

    # -- auth --------------------------------------------------------------------------------------

    async def authenticate(self, token: str | None) -> Principal:
        """Resolve a bearer token. Positive answers are cached (the hot path then costs no store read)
        until the store's revocation epoch moves, and serve on while the store is unreachable, so
        running sandboxes keep serving."""
        if not token:
            raise Unauthorized("missing bearer token")
        key = hashlib.sha256(token.encode()).digest()
        now = self.clock.now()
        await self._follow_revocations(now)
        cached = self._tokens.get(key)
        if cached is not None and cached[1] > now:
            return cached[0]
        try:
            principal = await self.store.resolve_token(token)
        except StoreUnavailable:
            if cached is not None:
                return cached[0]
            raise
        if principal is None:
            self._tokens.pop(key, None)
            raise Unauthorized("unknown token")
        if len(self._tokens) > 10_000:
            self._tokens.clear()
        self._tokens[key] = (principal, now + TOKEN_CACHE_S)
        return principal

    async def _follow_revocations(self, now: float) -> None:
        if now - self._epoch_read_at < REVOCATION_POLL_S:
            return
        # Marked before the read: requests arriving meanwhile use the cache rather than all reading.
        self._epoch_read_at = now
        try:
            epoch = await self.store.auth_epoch()
        except StoreUnavailable:
            return
        if epoch != self._epoch:
            self._tokens.clear()
            self._epoch = epoch

    def forget_cached_tokens(self) -> None:
        """This replica's own revocation takes effect here at once (others follow the epoch)."""
        self._tokens.clear()
        self._epoch_read_at = float("-inf")

    async def tokens(self, tenant_id: str | None = None) -> list[TokenRecord]:
        return await self.store.list_tokens(tenant_id=tenant_id)

    async def issue_admin_token(self) -> str:
        assert self.default_tenant_id is not None
        return await self.store.issue_token(self.default_tenant_id, Role.ADMIN)

    async def issue_metrics_token(self) -> str:
        return await self.store.issue_token(None, Role.METRICS)

    async def issue_tenant_token(self, name: str) -> tuple[TenantRecord, str]:
        tenant = await self.store.get_tenant_by_name(name)
        if tenant is None:
            raise ResourceNotFound(f"no tenant {name!r}")
        return tenant, await self.store.issue_token(tenant.id, Role.TENANT)

    async def revoke_token(self, token_id: str, caller: Principal) -> None:
        if token_id == caller.token_id:
            # An operator revoking the token in hand would lock themselves out mid-rotation.
            raise Forbidden("a token cannot revoke itself; revoke it with another admin token")
        if not await self.store.revoke_token(token_id):
            raise ResourceNotFound(f"no token {token_id}")
        self.forget_cached_tokens()

    async def enrol_host(self, host_id: str) -> HostCredentials:
        creds = await self.store.enrol_host(host_id)
        self.forget_cached_tokens()
        self.agents.forget_key(host_id)
        self.view.invalidate()
        return creds

    async def forget_host(self, host_id: str) -> None:
        try:
            found = await self.store.forget_host(host_id)
        except HostHasSandboxes as e:
            raise HostInUse(str(e)) from e
        if not found:
            raise ResourceNotFound(f"no host {host_id}")
        self.forget_cached_tokens()
        self.agents.forget_key(host_id)
        self.view.invalidate()

    # -- hosts -------------------------------------------------------------------------------------

    async def heartbeat(self, hb: AgentHeartbeat, sender: Principal | None = None) -> HeartbeatResult:
        """``sender``: who sent it over the network (None: an agent in this process). An agent token
        speaks for its own host only; a fleet-wide one only in the development mode that made it."""
        if sender is not None:
            if sender.role is not Role.AGENT:
                raise Forbidden("only an agent token may heartbeat")
            own = sender.host_id == hb.agent_id
            if not (own or (sender.host_id is None and self.shared_agent_token)):
                raise Forbidden(f"this agent token does not speak for host {hb.agent_id}")
        result = await self.heartbeats.accept(hb)
        last = self.view.last
        if last is not None and hb.agent_id not in last.records:
            # A host the cached view has never seen: its absence there was only the cache's age (at
            # start-up, a view read before the rest of the fleet's first heartbeats).
            self.view.invalidate()
        return result

    async def heartbeat_reply(self, hb: AgentHeartbeat, sender: Principal | None = None) -> HeartbeatReply:
        """Accept a heartbeat (as :meth:`heartbeat` does) and answer with the host's warm targets."""
        result = await self.heartbeat(hb, sender)
        return HeartbeatReply(
            accepted=result.accepted,
            confirmed=result.confirmed,
            listed_seq=result.listed_seq,
            state=result.host.state.value,
            warm_targets=await self.pool_book.targets_for(hb.agent_id),
            stop=sorted(result.fenced),
            secrets=await self._restored_secrets(hb) if hb.restore and result.accepted else {},
            run_lease_s=self.config.timeouts.run_lease if result.accepted else None,
            dead_after_s=self.config.timeouts.dead_after_s if result.accepted else None,
        )

    async def _restored_secrets(self, hb: AgentHeartbeat) -> dict[str, dict[str, str]]:
        """Secrets of sandboxes an agent adopted after a restart, for those its record says it owns at
        the epoch the agent holds (read per sandbox: only after a restart, never on a periodic path)."""
        out: dict[str, dict[str, str]] = {}
        for sandbox_id in hb.restore:
            rec = await self.store.get_sandbox(sandbox_id)
            if rec is None or rec.host_id != hb.agent_id or rec.epoch != hb.epochs.get(sandbox_id, 0):
                continue
            if rec.state not in (SandboxState.RUNNING, SandboxState.ORPHANED):
                continue
            spec = await self.creates.unsealed_spec(rec)
            if spec.secrets:
                out[sandbox_id] = dict(spec.secrets)
        return out

    async def hosts(self) -> list[HostStatus]:
        snap = await self.view.get(fresh=True)
        now = self.clock.now()
        return [HostStatus(r, max(0.0, now - r.heartbeat_at)) for r in snap.records.values()]

    async def drain(self, host_id: str, draining: bool, *, evacuate: bool = False) -> HostRecord:
        try:
            rec = await (self.store.drain(host_id) if draining else self.store.undrain(host_id))
        except RecordNotFound as e:
            raise ResourceNotFound(f"no host {host_id}") from e
        self.view.invalidate()
        if draining and evacuate:
            # Marked here; the leader's next round places them, as after a host's death.
            await self.failover.evacuate(host_id)
        return rec

    # -- templates and tenants ----------------------------------------------------------------

    async def create_template(self, tpl: TemplateRecord) -> TemplateRecord:
        self.config.check_memory(tpl.memory_mb)
        try:
            return await self.store.create_template(tpl)
        except NameConflict as e:
            raise Conflict(f"template {tpl.name!r} exists", details={"field": "name"}) from e

    async def create_tenant(
        self, name: str, max_sandboxes: int, max_memory_mb: int, max_cpus: float = DEFAULT_MAX_CPUS
    ) -> tuple[TenantRecord, str]:
        try:
            tenant = await self.store.create_tenant(
                name, max_sandboxes=max_sandboxes, max_memory_mb=max_memory_mb, max_cpus=max_cpus
            )
        except NameConflict as e:
            raise Conflict(f"tenant {name!r} exists", details={"field": "name"}) from e
        token = await self.store.issue_token(tenant.id, Role.TENANT)
        return tenant, token

    async def delete_tenant(self, name: str) -> None:
        """Remove a tenant none of whose sandboxes is live (its sandboxes are deleted first, never by
        this): every token of it, E2B keys included, stops working here at once and on the other
        replicas when they next read the revocation epoch."""
        if name == DEFAULT_TENANT:
            # The admin tokens are the default tenant's, and every replica re-creates it at start-up.
            raise Forbidden(f"the {DEFAULT_TENANT!r} tenant holds the admin tokens: it is never removed")
        tenant = await self.store.get_tenant_by_name(name)
        if tenant is None:
            raise ResourceNotFound(f"no tenant {name!r}")
        try:
            found = await self.store.delete_tenant(tenant.id)
        except TenantHasSandboxes as e:
            raise TenantInUse(
                f"tenant {name!r} has {e.live} live sandboxes: delete them first, then remove the tenant",
                details={"live_sandboxes": e.live},
            ) from e
        if not found:  # removed meanwhile by another request
            raise ResourceNotFound(f"no tenant {name!r}")
        self.forget_cached_tokens()

    async def set_quota(
        self,
        name: str,
        *,
        max_sandboxes: int | None = None,
        max_memory_mb: int | None = None,
        max_cpus: float | None = None,
    ) -> TenantRecord:
        """Change a tenant's limits (None: as it is). Lowered below what it holds, it refuses new
        creates until enough of its sandboxes end; nothing running is stopped."""
        tenant = await self.store.get_tenant_by_name(name)
        if tenant is None:
            raise ResourceNotFound(f"no tenant {name!r}")
        try:
            return await self.store.set_quota(
                tenant.id,
                max_sandboxes=tenant.max_sandboxes if max_sandboxes is None else max_sandboxes,
                max_memory_mb=tenant.max_memory_mb if max_memory_mb is None else max_memory_mb,
                max_cpus=max_cpus,
            )
        except RecordNotFound as e:
            raise ResourceNotFound(f"no tenant {name!r}") from e

    async def set_create_rate(
        self, name: str, *, rate_per_s: float | object | None = UNSET, burst: int | object | None = UNSET
    ) -> TenantRecord:
        """Change a tenant's create rate (left out: as it is; None: back to the configured default).
        Here it holds at once, on the other replicas at their next read of the rates."""
        tenant = await self.store.get_tenant_by_name(name)
        if tenant is None:
            raise ResourceNotFound(f"no tenant {name!r}")
        try:
            updated = await self.store.set_create_rate(
                tenant.id,
                rate_per_s=_given(rate_per_s, tenant.create_rate_per_s),
                burst=_given(burst, tenant.create_burst),
            )
        except RecordNotFound as e:
            raise ResourceNotFound(f"no tenant {name!r}") from e
        self.rates.adopt(updated)
        return updated

    def store_unavailable(self, exc: StoreUnavailable) -> Unavailable:
        self.metrics.refusals.labels(ErrorCode.STORE_UNAVAILABLE).inc()
        return Unavailable(
            f"the state of record cannot be reached: {exc}",
            code=ErrorCode.STORE_UNAVAILABLE,
            retry_after_s=self.retry_after.estimate(ErrorCode.STORE_UNAVAILABLE, None),
        )


def _given(value: object, current: T) -> T:
    """``value`` where one was given, else ``current``."""
    return current if value is UNSET else cast(T, value)


def build_replica(
    store: Store,
    agents: AgentDirectory,
    config: ControlConfig,
    clock: Clock,
    rng: random.Random,
    *,
    sealer: Sealer | None = None,
    blobs: BlobStore | None = None,
) -> ControlPlane:
    """The one place a replica's control plane is built. ``clock`` and ``rng`` are the caller's: the
    wall clock and a fresh generator for a server, a manual or virtual clock and a seeded generator for
    a test or a simulated run. ``sealer``: None seals nothing (no secrets, recreate or parked creates).
    ``blobs``: where images are kept (None: the store's own, when it keeps any: :func:`own_blobs`).
    """
    blobs = blobs if blobs is not None else own_blobs(store)
    return ControlPlane(store, agents, config, clock=clock, rng=rng, sealer=sealer, blobs=blobs)
