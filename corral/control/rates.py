"""Each tenant's create rate, enforced by every replica as its share of the sum.

A tenant's rate (creates a second, and at most at once) is on its record in the store, or the
configured default. Every replica keeps a token bucket per tenant (:mod:`corral.core.rates`) at
``1/N`` of it, ``N`` the replicas holding a live lease, so the fleet of replicas never admits more than
the tenant's rate in all, without a store round trip per create: a refusal costs a replica a dict
lookup, before anything is read or written. The limits and ``N`` are read again every
``rate_refresh_s`` (one read of the tenants and one count of the leases, however many creates); a
limit set through this replica takes effect here at once, on the others at their next read.

The share assumes the balancer spreads a tenant's creates over the replicas; one whose creates all
reach one replica gets that replica's share, never more than its rate.
"""

from __future__ import annotations

import logging
import math

from corral.control.config import ControlConfig
from corral.control.errors import TenantRateLimited
from corral.control.metrics import Metrics
from corral.control.ports import RatesPort
from corral.core import Clock
from corral.core.rates import Buckets, Rate
from corral.store import TenantRecord

log = logging.getLogger(__name__)


def rate_of(record: TenantRecord, default: Rate | None) -> Rate | None:
    """A tenant's whole create rate (None: unbounded): its own, else the default. A burst it does not
    name is the default's, else one second's worth of its rate."""
    if record.create_rate_per_s is None:
        if default is None or record.create_burst is None:
            return default
        return Rate(default.rate_per_s, record.create_burst)
    burst = record.create_burst
    if burst is None and default is not None:
        burst = default.burst
    return Rate.of(record.create_rate_per_s, burst)


class TenantRates:
    def __init__(self, store: RatesPort, clock: Clock, config: ControlConfig, metrics: Metrics) -> None:
        self.store = store
        self.clock = clock
        self.metrics = metrics
        self.refresh_s = config.rate_refresh_s
        self.default = config.default_create_rate
        self._rates: dict[str, Rate | None] = {}
        self._names: dict[str, str] = {}
        self.replicas = 1
        self._read_at = -math.inf
        self._buckets = Buckets()

    def adopt(self, record: TenantRecord) -> None:
        """A tenant's record as just read or written: its rate holds on this replica from now."""
        self._rates[record.id] = rate_of(record, self.default)
        self._names[record.id] = record.name

    def share(self, tenant_id: str) -> Rate | None:
        """This replica's share of the tenant's rate (None: unbounded)."""
        whole = self._rates.get(tenant_id, self.default)
        return whole.share(self.replicas) if whole is not None else None

    def take(self, tenant_id: str, cost: int = 1) -> None:
        """Pay for ``cost`` creates of the tenant, or raise :class:`TenantRateLimited` with when they
        could be paid. A batch costs at most a full bucket, so no batch waits forever."""
        rate = self.share(tenant_id)
        if rate is None:
            return
        refused = self._buckets.take(tenant_id, rate, self.clock.now(), min(cost, rate.burst))
        if refused is None:
            return
        self.refused(tenant_id, TenantRateLimited.code)
        raise TenantRateLimited(
            f"this tenant's creates are limited to {rate.rate_per_s:g}/s here "
            f"(a burst of {rate.burst}; its rate is shared by {self.replicas} replicas)",
            retry_after_s=refused.retry_after_s,
            details={"rate_per_s": rate.rate_per_s, "burst": rate.burst, "replicas": self.replicas},
        )

    def refused(self, tenant_id: str, reason: str) -> None:
        """Count a refusal of one of the tenant's creates, by its name where known."""
        self.metrics.tenant_refusals.labels(self._names.get(tenant_id, tenant_id), reason).inc()

    async def refresh(self) -> None:
        """Read the tenants' rates and the live replicas again if the last read is ``refresh_s`` old.
        Never raises: a store that cannot be read leaves the last rates in force."""
        now = self.clock.now()
        if now - self._read_at < self.refresh_s:
            return
        self._read_at = now
        try:
            tenants = await self.store.list_tenants()
            replicas = await self.store.live_replicas()
        except Exception as exc:
            log.info("tenant rates not refreshed: %r", exc)
            return
        self._rates = {t.id: rate_of(t, self.default) for t in tenants}
        self._names = {t.id: t.name for t in tenants}
        self.replicas = max(1, replicas)
