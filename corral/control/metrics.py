"""What must be visible to an operator: Prometheus names, base units, one registry per control plane so
several can live in one process (tests, ``corral serve``)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from corral.store import HostRecord

MiB = 1024 * 1024

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
AGE_BUCKETS = (0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


class FleetCollector(Collector):
    """Gauges computed at scrape time from the last fleet read: no second source of truth."""

    def __init__(self) -> None:
        self.hosts: list[HostRecord] = []
        self.committed_mb: int = 0

    def collect(self) -> Iterable[GaugeMetricFamily]:
        hosts = self.hosts
        reserved = GaugeMetricFamily(
            "corral_host_reserved_memory_bytes", "Outstanding reserved memory per host", labels=["host"]
        )
        sandboxes = GaugeMetricFamily(
            "corral_host_sandboxes", "Sandboxes a host accounts for", labels=["host"]
        )
        admittable = GaugeMetricFamily(
            "corral_host_admittable_memory_bytes", "Memory a host says it can still admit", labels=["host"]
        )
        for h in hosts:
            reserved.add_metric([h.id], h.reserved_mb * MiB)
            sandboxes.add_metric([h.id], h.sandbox_count)
            admittable.add_metric([h.id], h.memory_mb_admittable * MiB)
        yield reserved
        yield sandboxes
        yield admittable
        loads = [h.sandbox_count for h in hosts]
        ratio = GaugeMetricFamily(
            "corral_host_load_max_to_median_ratio",
            "Max-to-median sandboxes per host: the one number that catches a pile-up",
        )
        median = statistics.median(loads) if loads else 0.0
        ratio.add_metric([], (max(loads) / median) if median else (float(max(loads)) if loads else 0.0))
        yield ratio
        resident = GaugeMetricFamily(
            "corral_resident_to_committed_memory_ratio",
            "Fleet resident memory over the memory its sandboxes were promised",
        )
        used = sum(h.memory_mb_used for h in hosts)
        resident.add_metric([], used / self.committed_mb if self.committed_mb else 0.0)
        yield resident


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.placements = Counter("corral_placements", "Sandboxes placed, by host", ["host"], registry=r)
        self.refusals = Counter("corral_refusals", "Create refusals, by reason", ["reason"], registry=r)
        self.tenant_refusals = Counter(
            "corral_tenant_refusals",
            "A tenant's creates refused, by tenant and reason",
            ["tenant", "reason"],
            registry=r,
        )
        self.agent_refusals = Counter(
            "corral_bind_refusals", "Binds an agent refused, by host and code", ["host", "code"], registry=r
        )
        self.reserve_conflicts = Counter(
            "corral_reserve_conflicts", "Reservations the store refused (room taken meanwhile)", registry=r
        )
        self.create_latency = Histogram(
            "corral_create_duration_seconds",
            "Create latency, by host",
            ["host"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.view_age = Histogram(
            "corral_decision_view_age_seconds",
            "Age of the oldest heartbeat a placement decision used",
            buckets=AGE_BUCKETS,
            registry=r,
        )
        self.refusal_to_success = Histogram(
            "corral_refusal_to_success_seconds",
            "Time from a create's first refusal to its eventual success (same Idempotency-Key)",
            buckets=AGE_BUCKETS,
            registry=r,
        )
        self.heartbeats = Counter("corral_heartbeats", "Heartbeats received", ["accepted"], registry=r)
        self.waiting = Gauge(
            "corral_waiting_creates",
            "Creates parked in waiting_capacity, as the leader last counted",
            registry=r,
        )
        self.waited = Histogram(
            "corral_create_waited_seconds",
            "Time a parked create waited until it was placed",
            buckets=AGE_BUCKETS,
            registry=r,
        )
        self.fleet = FleetCollector()
        r.register(self.fleet)
        # Each placed create counts on its host's children: found once per host, not looked up (and
        # its labels checked) on every create.
        self._placed: dict[str, tuple[Counter, Histogram]] = {}

    def placed(self, host: str, latency_s: float) -> None:
        """A create placed on ``host`` in ``latency_s``."""
        children = self._placed.get(host)
        if children is None:
            children = self._placed[host] = (self.placements.labels(host), self.create_latency.labels(host))
        children[0].inc()
        children[1].observe(latency_s)
