"""Warm pools in the control plane: the intent (a pool per template, per-host targets), the leader's
spreading of each pool over the hosts that can run it, the targets each heartbeat's reply carries, and
the claim a create tries before a cold placement.

A claim is an ownership transfer on one host, not a create: the sandbox is placed and booted already.
The agent hands one over from memory; the record is written after, before the response. A hand-over
whose record never got written (the replica died between the two) shows in heartbeats as a claimed
sandbox no record claims, and the stray sweep stops it: it may hold a tenant's environment, so it
never goes back to a pool, and having no record it is never counted.
"""

from __future__ import annotations

import contextlib
import random
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace

from prometheus_client import CollectorRegistry, Counter, Histogram

from corral.agent.errors import AgentError
from corral.agent.protocol import ClaimWarm, WarmTarget
from corral.control.errors import Conflict, InvalidRequest, ResourceNotFound
from corral.control.metrics import LATENCY_BUCKETS
from corral.control.ports import AgentLookup, ClaimRecords, PoolReader, PoolStore
from corral.control.view import FleetSnapshot, ViewCache
from corral.core import AdmissionPolicy, Clock, CreateRequest, HostState
from corral.core.admission import request_charge_mb
from corral.core.warm import CLAIM_TRIES, Slot, pick_warm, spread
from corral.shapes.pools import PoolHost
from corral.store import (
    UNSET,
    CreateOutcome,
    HostRecord,
    NameConflict,
    PoolRecord,
    RecordNotFound,
    SandboxRecord,
    SandboxState,
    TemplateRecord,
)

# How long the pools and their targets are trusted between reads (heartbeat replies, claims).
POOLS_CACHE_S = 2.0
CLAIM_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, *LATENCY_BUCKETS)


# -- spreading (pure) --------------------------------------------------------------------------------


def eligible(host: HostRecord, template: str, now: float, stale_after_s: float) -> bool:
    return (
        host.state is HostState.READY
        and now - host.heartbeat_at <= stale_after_s
        and (host.templates is None or template in host.templates)
    )


def plan(
    pools: Sequence[PoolRecord],
    templates: Mapping[str, TemplateRecord],
    hosts: Sequence[HostRecord],
    now: float,
    stale_after_s: float,
    policy: AdmissionPolicy,
    rng: random.Random,
) -> dict[str, dict[str, int]]:
    """Targets for every pool. A host publishes the room its ready warm sandboxes hold as admittable
    (any real create may take it), so that room is there for the pools too; pools share it, one
    pool's targets charged before the next is spread."""
    room = {h.id: h.memory_mb_admittable - h.reserved_mb for h in hosts}
    out: dict[str, dict[str, int]] = {}
    for pool in sorted(pools, key=lambda p: p.template):
        tpl = templates.get(pool.template)
        if tpl is None:
            out[pool.template] = {}
            continue
        req = CreateRequest(memory_mb=tpl.memory_mb, cpu=tpl.cpus, stateful=tpl.stateful)
        by_host = {h.id: h for h in hosts if eligible(h, pool.template, now, stale_after_s)}
        charge = max(
            (request_charge_mb(req, h.memory_admission, policy) for h in by_host.values()), default=1
        )
        slots = [Slot(h, room[h]) for h in sorted(by_host)]
        targets = spread(pool.size, pool.max_per_host, slots, pool.targets, charge, rng)
        for h, n in targets.items():
            room[h] -= n * charge
        out[pool.template] = targets
    return out


# -- metrics ---------------------------------------------------------------------------------------


class WarmMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.hits = Counter(
            "corral_warm_hits",
            "Creates served by a warm sandbox, per template",
            ["template"],
            registry=registry,
        )
        self.misses = Counter(
            "corral_warm_misses",
            "Creates for a pooled template that went cold, per template and why",
            ["template", "reason"],
            registry=registry,
        )
        self.claim_latency = Histogram(
            "corral_warm_claim_seconds",
            "A warm create end to end in the control plane (claim on the agent and the record)",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.agent_claim_latency = Histogram(
            "corral_warm_agent_claim_seconds",
            "The agent's hand-over as the control plane waited for it",
            buckets=CLAIM_BUCKETS,
            registry=registry,
        )
        self.released = Counter(
            "corral_warm_claims_released",
            "Warm sandboxes handed over but stopped because the record was refused",
            registry=registry,
        )


# -- the pools' intent, cached -----------------------------------------------------------------------


class PoolBook:
    """The pools and their templates as this replica last read them (at most ``POOLS_CACHE_S`` old)."""

    def __init__(self, store: PoolReader, clock: Clock) -> None:
        self.store = store
        self.clock = clock
        self.pools: dict[str, PoolRecord] = {}
        self.templates: dict[str, TemplateRecord] = {}
        self._read_at: float | None = None

    async def refresh(self, *, force: bool = False) -> None:
        now = self.clock.now()
        if not force and self._read_at is not None and now - self._read_at <= POOLS_CACHE_S:
            return
        pools = await self.store.list_pools()
        self.templates = {t.name: t for t in await self.store.list_templates()} if pools else {}
        self.pools = {p.template: p for p in pools}
        self._read_at = now

    def invalidate(self) -> None:
        self._read_at = None

    async def get(self, template: str) -> PoolRecord | None:
        await self.refresh()
        return self.pools.get(template)

    async def targets_for(self, host_id: str) -> list[WarmTarget]:
        await self.refresh()
        out = []
        for pool in self.pools.values():
            n = pool.targets.get(host_id, 0)
            tpl = self.templates.get(pool.template)
            if n > 0 and tpl is not None:
                out.append(
                    WarmTarget(
                        template=pool.template,
                        target=n,
                        memory_mb=tpl.memory_mb,
                        cpus=tpl.cpus,
                        stateful=tpl.stateful,
                        image=tpl.image,
                        disk_mb=tpl.disk_mb,
                        user=tpl.image_config.user if tpl.image_config is not None else None,
                        workdir=tpl.image_config.workdir if tpl.image_config is not None else None,
                    )
                )
        return out


# -- the claim -------------------------------------------------------------------------------------


class ClaimsSeen:
    """This replica's claims per (host, template) that the host's last heartbeat may not show yet: a
    claim made after the heartbeat was received is still in its advertised ready count."""

    def __init__(self) -> None:
        self._at: dict[tuple[str, str], deque[float]] = {}
        self._in_flight: dict[tuple[str, str], int] = {}

    def taken(self, host: HostRecord, template: str) -> int:
        key = (host.id, template)
        times = self._at.get(key)
        if times:
            while times and times[0] <= host.heartbeat_at:
                times.popleft()
        return (len(times) if times else 0) + self._in_flight.get(key, 0)

    @contextlib.contextmanager
    def claiming(self, host_id: str, template: str, clock: Clock) -> Iterator[list[bool]]:
        key = (host_id, template)
        self._in_flight[key] = self._in_flight.get(key, 0) + 1
        done = [False]
        try:
            yield done
        finally:
            self._in_flight[key] -= 1
            if done[0]:
                self._at.setdefault(key, deque()).append(clock.now())


@dataclass(eq=False, repr=False)
class WarmClaims:
    """The claim step of a create: pick a host by power-of-2 over advertised ready counts (minus this
    replica's claims), let its agent hand one over, write the record. None: go cold."""

    store: ClaimRecords
    view: ViewCache
    agents: AgentLookup
    book: PoolBook
    clock: Clock
    rng: random.Random
    stale_after_s: float
    metrics: WarmMetrics
    seen: ClaimsSeen = field(default_factory=ClaimsSeen, init=False)
    hits: dict[str, int] = field(default_factory=dict, init=False)
    misses: dict[str, int] = field(default_factory=dict, init=False)

    def miss(self, template: str, reason: str) -> None:
        self.misses[template] = self.misses.get(template, 0) + 1
        self.metrics.misses.labels(template, reason).inc()

    def candidates(self, snap: FleetSnapshot, template: str) -> list[tuple[HostRecord, int]]:
        now = self.clock.now()
        out = []
        for h in snap.records.values():
            if not eligible(h, template, now, self.stale_after_s):
                continue
            left = h.warm_ready(template) - self.seen.taken(h, template)
            if left > 0:
                out.append((h, left))
        return out

    @staticmethod
    def eligible_spec(
        tpl: TemplateRecord, memory_mb: int | None, cpus: float | None, stateful: bool | None
    ) -> bool:
        """A warm sandbox was admitted with its template's resources: a create asking for other ones
        is a different sandbox, and goes cold."""
        return (
            (memory_mb is None or memory_mb == tpl.memory_mb)
            and (cpus is None or cpus == tpl.cpus)
            and (stateful is None or stateful == tpl.stateful)
        )

    async def claim(
        self,
        record: SandboxRecord,
        env: Mapping[str, str],
        *,
        idempotency_key: str | None,
        request_hash: str | None,
    ) -> CreateOutcome | None:
        """``record`` is the create's record as a cold create would write it (its id is replaced by
        the warm sandbox's); the outcome is the store's, a replay when the key had been seen. Store
        errors (quota, name, idempotency) propagate as the store raises them."""
        template = record.template
        began = self.clock.now()
        seen = await self.store.check_create(
            record, idempotency_key=idempotency_key, request_hash=request_hash
        )
        if seen is not None:
            return seen
        snap = await self.view.get()
        candidates = self.candidates(snap, template)
        if not candidates:
            self.miss(template, "none_advertised")
            return None
        for _ in range(CLAIM_TRIES):
            if not candidates:
                break
            host, _left = pick_warm(candidates, self.rng)
            candidates = [c for c in candidates if c[0].id != host.id]
            with self.seen.claiming(host.id, template, self.clock) as done:
                t0 = self.clock.now()
                try:
                    info = await self.agents.client(host.id, host.address).claim(
                        template, ClaimWarm(env=dict(env))
                    )
                except AgentError:
                    continue  # none left there (the view was stale), or unreachable: the next one
                done[0] = True
                self.metrics.agent_claim_latency.observe(max(0.0, self.clock.now() - t0))
            owned = replace(record, id=info.id, host_id=host.id, state=SandboxState.RUNNING, warm=True)
            try:
                out = await self.store.create_sandbox(
                    owned, idempotency_key=idempotency_key, request_hash=request_hash
                )
            except BaseException:
                await self._release(host, info.id)
                raise
            if out.replayed:  # a twin request recorded first: this hand-over is not needed
                await self._release(host, info.id)
                return out
            self.hits[template] = self.hits.get(template, 0) + 1
            self.metrics.hits.labels(template).inc()
            self.metrics.claim_latency.observe(max(0.0, self.clock.now() - began))
            return out
        self.miss(template, "empty")
        return None

    async def _release(self, host: HostRecord, sandbox_id: str) -> None:
        """A handed-over sandbox no record will own: stop it (never back to a pool: it saw an env).
        If the agent cannot be told now, the stray sweep stops it."""
        self.metrics.released.inc()
        with contextlib.suppress(Exception):
            await self.agents.client(host.id, host.address).stop(sandbox_id)


# -- the leader's spreading, and the admin's operations -----------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolStatus:
    pool: PoolRecord
    ready: int
    starting: int
    per_host: dict[str, PoolHost]
    hits: int
    misses: int


@dataclass(eq=False, repr=False)
class Pools:
    store: PoolStore
    view: ViewCache
    book: PoolBook
    claims: WarmClaims
    clock: Clock
    rng: random.Random
    stale_after_s: float
    policy: AdmissionPolicy

    async def rebalance(self) -> int:
        """The leader's round: spread every pool, write the targets that changed. Returns how many
        pools changed."""
        pools = await self.store.list_pools()
        if not pools:
            return 0
        templates = {t.name: t for t in await self.store.list_templates()}
        snap = await self.view.get()
        targets = plan(
            pools,
            templates,
            list(snap.records.values()),
            self.clock.now(),
            self.stale_after_s,
            self.policy,
            self.rng,
        )
        changed = 0
        for pool in pools:
            new = targets.get(pool.template, {})
            if new != dict(pool.targets):
                await self.store.set_pool_targets(pool.template, new)
                changed += 1
        if changed:
            self.book.invalidate()
        return changed

    async def create(self, template: str, size: int, max_per_host: int | None) -> PoolStatus:
        try:
            pool = await self.store.create_pool(template, size=size, max_per_host=max_per_host)
        except NameConflict as e:
            raise Conflict(f"template {template!r} already has a pool", details={"field": "template"}) from e
        except RecordNotFound as e:
            raise InvalidRequest("template", f"unknown template {template!r}") from e
        await self.rebalance()
        return await self.get(pool.template)

    async def update(self, template: str, size: int | None, max_per_host: int | object | None) -> PoolStatus:
        try:
            await self.store.update_pool(
                template,
                size=size,
                max_per_host=UNSET if max_per_host is UNSET else max_per_host,  # type: ignore[arg-type]
            )
        except RecordNotFound as e:
            raise ResourceNotFound(f"no pool for template {template!r}") from e
        await self.rebalance()
        return await self.get(template)

    async def delete(self, template: str) -> None:
        """The pool's unclaimed warm sandboxes are stopped by their agents once the targets are gone;
        claimed ones belong to their tenants and stay."""
        if not await self.store.delete_pool(template):
            raise ResourceNotFound(f"no pool for template {template!r}")
        self.book.invalidate()

    async def list(self) -> list[PoolStatus]:
        snap = await self.view.get()
        return [self.status(p, snap) for p in await self.store.list_pools()]

    async def get(self, template: str) -> PoolStatus:
        for status in await self.list():
            if status.pool.template == template:
                return status
        raise ResourceNotFound(f"no pool for template {template!r}")

    def status(self, pool: PoolRecord, snap: FleetSnapshot) -> PoolStatus:
        per_host: dict[str, PoolHost] = {}
        for h in snap.records.values():
            ready, starting = h.warm.get(pool.template, (0, 0))
            target = pool.targets.get(h.id, 0)
            if ready or starting or target:
                per_host[h.id] = PoolHost(target=target, ready=ready, starting=starting)
        return PoolStatus(
            pool=pool,
            ready=sum(p.ready for p in per_host.values()),
            starting=sum(p.starting for p in per_host.values()),
            per_host=dict(sorted(per_host.items())),
            hits=self.claims.hits.get(pool.template, 0),
            misses=self.claims.misses.get(pool.template, 0),
        )
