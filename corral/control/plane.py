"""One control-plane replica: the store, the view, the agents, the create flow and the reconciler,
wired together. The API is a thin skin over this object; tests drive it directly."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
from dataclasses import dataclass

from corral.agent.protocol import Heartbeat as WireHeartbeat
from corral.agent.protocol import HeartbeatReply
from corral.control.agents import AgentDirectory
from corral.control.batch import BatchCreate
from corral.control.config import ControlConfig
from corral.control.create import CreateFlow
from corral.control.errors import Conflict, NotFound, Unauthorized, Unavailable
from corral.control.heartbeats import HeartbeatIntake
from corral.control.metrics import Metrics
from corral.control.pools import PoolBook, Pools, WarmClaims, WarmMetrics
from corral.control.reconcile import Reconciler
from corral.control.retry import RetryAfter
from corral.control.routes import RouteCache
from corral.control.sandboxes import Sandboxes
from corral.control.view import ViewCache
from corral.core import Clock, SystemClock
from corral.store import (
    HeartbeatResult,
    HostRecord,
    NameConflict,
    Principal,
    Role,
    Store,
    StoreUnavailable,
    TemplateRecord,
    TenantRecord,
)
from corral.store import NotFound as StoreNotFound

DEFAULT_TENANT = "default"
# How long a resolved token is trusted without asking the store again (a revoked token lives this long).
TOKEN_CACHE_S = 10.0


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
        self.routes = RouteCache()
        self.creates = CreateFlow(
            store, self.view, agents, self.config, self.clock, self.rng, self.metrics, self.retry_after
        )
        self.batches = BatchCreate(self.creates)
        self.sandboxes = Sandboxes(store, self.view, agents, self.routes)
        self.heartbeats = HeartbeatIntake(store, self.metrics)
        self.reconciler = Reconciler(
            store, self.view, agents, self.config, self.clock, self.metrics, self.retry_after, self.routes
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
        self.creates.warm = self.warm
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
        self.reconciler.leader_work.append(self.pools.rebalance)
        self._task: asyncio.Task[None] | None = None
        self.migrated = False
        self.default_tenant_id: str | None = None
        self._tokens: dict[bytes, tuple[Principal, float]] = {}

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self, *, admin_token: str | None = None, agent_token: str | None = None) -> None:
        await self.store.migrate()
        self.migrated = True
        tenant = await self._ensure_tenant(DEFAULT_TENANT)
        self.default_tenant_id = tenant.id
        if admin_token:
            await self.store.ensure_token(admin_token, tenant.id, Role.ADMIN)
        if agent_token:
            await self.store.ensure_token(agent_token, None, Role.AGENT)
        await self.store.renew_replica(self.config.replica_id, self.config.replica_lease_s)
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
            )
        except NameConflict:  # another replica created it first
            again = await self.store.get_tenant_by_name(name)
            assert again is not None
            return again

    async def ready(self) -> None:
        if not self.migrated:
            raise Unavailable("migrations not applied", code="store_unavailable", retry_after_s=1)
        await self.store.ping()

    # -- auth --------------------------------------------------------------------------------------

    async def authenticate(self, token: str | None) -> Principal:
        """Resolve a bearer token. Positive answers are cached briefly (the hot path then costs no
        store read) and serve on while the store is unreachable, so running sandboxes keep serving."""
        if not token:
            raise Unauthorized("missing bearer token")
        key = hashlib.sha256(token.encode()).digest()
        now = self.clock.now()
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

    # -- hosts -------------------------------------------------------------------------------------

    async def heartbeat(self, hb: WireHeartbeat) -> HeartbeatResult:
        return await self.heartbeats.accept(hb)

    async def heartbeat_reply(self, hb: WireHeartbeat) -> HeartbeatReply:
        """Accept a heartbeat and answer with the host's warm targets."""
        result = await self.heartbeats.accept(hb)
        return HeartbeatReply(
            accepted=result.accepted,
            confirmed=result.confirmed,
            state=result.host.state.value,
            warm_targets=await self.pool_book.targets_for(hb.agent_id),
        )

    async def hosts(self) -> list[HostStatus]:
        snap = await self.view.get(fresh=True)
        now = self.clock.now()
        return [HostStatus(r, max(0.0, now - r.heartbeat_at)) for r in snap.records.values()]

    async def drain(self, host_id: str, draining: bool) -> HostRecord:
        try:
            rec = await (self.store.drain(host_id) if draining else self.store.undrain(host_id))
        except StoreNotFound as e:
            raise NotFound(f"no host {host_id}") from e
        self.view.invalidate()
        return rec

    # -- templates and tenants ----------------------------------------------------------------

    async def create_template(self, tpl: TemplateRecord) -> TemplateRecord:
        try:
            return await self.store.create_template(tpl)
        except NameConflict as e:
            raise Conflict(f"template {tpl.name!r} exists", details={"field": "name"}) from e

    async def create_tenant(
        self, name: str, max_sandboxes: int, max_memory_mb: int
    ) -> tuple[TenantRecord, str]:
        try:
            tenant = await self.store.create_tenant(
                name, max_sandboxes=max_sandboxes, max_memory_mb=max_memory_mb
            )
        except NameConflict as e:
            raise Conflict(f"tenant {name!r} exists", details={"field": "name"}) from e
        token = await self.store.issue_token(tenant.id, Role.TENANT)
        return tenant, token

    def store_unavailable(self, exc: StoreUnavailable) -> Unavailable:
        self.metrics.refusals.labels("store_unavailable").inc()
        return Unavailable(
            f"the state of record cannot be reached: {exc}",
            code="store_unavailable",
            retry_after_s=self.retry_after.estimate("store_unavailable", None),
        )
