"""The operators' view: one JSON document that the dashboard and ``corral top`` both draw.

Fleet numbers come from the store (hosts as their heartbeats and reservations left them; placements
and committed memory from the sandbox records), so every replica shows the same fleet. Per-request
figures (create latency, refusals, time from a refusal to success, the age of the view decisions used)
are this replica's own Prometheus series, read from its registry, and labelled with the replica.
Nothing here counts anything itself: it reads what the control plane already measures.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import Counter, Histogram

from corral.control.plane import ControlPlane, HostStatus
from corral.shapes.hosts import JOINING

WINDOW_S = 60.0
QUANTILES = (0.5, 0.99)


def quantile(buckets: Sequence[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram ``[(upper bound, count <= bound), ...]``, linear
    within the bucket it falls in (Prometheus's ``histogram_quantile``). None when it is empty."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound  # above the last finite bound: that bound is all we know
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


def _histograms(metric: Histogram, label: str | None) -> dict[str, list[tuple[float, float]]]:
    """Cumulative buckets per value of ``label`` ("" for an unlabelled histogram)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_bucket"):
                key = s.labels.get(label, "") if label else ""
                out.setdefault(key, []).append((float(s.labels["le"]), s.value))
    for v in out.values():
        v.sort()
    return out


def _by_tenant(metric: Counter) -> dict[str, dict[str, int]]:
    """A tenant's refusals by reason, per tenant."""
    out: dict[str, dict[str, int]] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_total") and s.value:
                reasons = out.setdefault(s.labels.get("tenant", ""), {})
                reasons[s.labels.get("reason", "")] = int(s.value)
    return {t: dict(sorted(r.items())) for t, r in sorted(out.items())}


def _counts(metric: Counter, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in metric.collect():
        for s in family.samples:
            if s.name.endswith("_total"):
                key = s.labels.get(label, "")
                out[key] = out.get(key, 0.0) + s.value
    return out


def _summary(buckets: Sequence[tuple[float, float]]) -> dict[str, Any]:
    count = buckets[-1][1] if buckets else 0.0
    out: dict[str, Any] = {"count": int(count)}
    for q in QUANTILES:
        v = quantile(buckets, q)
        out[f"p{round(q * 100)}_ms"] = None if v is None else round(v * 1000, 1)
    return out


def _merge(series: Iterable[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    total: dict[float, float] = {}
    for buckets in series:
        for bound, count in buckets:
            total[bound] = total.get(bound, 0.0) + count
    return sorted(total.items())


def build(
    hosts: Sequence[HostStatus],
    activity: dict[str, tuple[int, int]],
    plane: ControlPlane,
    now: float,
) -> dict[str, Any]:
    m = plane.metrics
    latency = _histograms(m.create_latency, "host")
    rows: list[dict[str, Any]] = []
    for h in sorted(hosts, key=lambda s: s.record.id):
        r = h.record
        placed, committed = activity.get(r.id, (0, 0))
        rows.append(
            {
                "id": r.id,
                "state": r.state.value if r.heard_from else JOINING,
                "heartbeat_age_s": round(h.heartbeat_age_s, 3) if r.heard_from else None,
                "sandboxes": r.sandbox_count,
                "placements_60s": placed,
                "memory_mb_total": r.memory_mb_total,
                "memory_mb_admittable": r.memory_mb_admittable,
                "reserved_mb": r.reserved_mb,
                "resident_mb": r.memory_mb_used,
                "committed_mb": committed,
                "memory_admission": r.memory_admission.value,
                "create_latency": _summary(latency.get(r.id, [])),
            }
        )
    loads: list[int] = [h.record.sandbox_count for h in hosts]
    median = float(statistics.median(loads)) if loads else 0.0
    biggest = max(loads) if loads else 0
    ages: list[float] = [h.heartbeat_age_s for h in hosts if h.record.heard_from]
    view_age = _histograms(m.view_age, None).get("", [])
    return {
        "now": now,
        "replica": plane.config.replica_id,
        "window_s": WINDOW_S,
        "fleet": {
            "hosts": len(rows),
            "sandboxes": sum(loads),
            "placements_60s": sum(row["placements_60s"] for row in rows),
            "max": biggest,
            "median": median,
            "max_to_median": round(biggest / median, 3) if median else None,
            "view_age_s": round(max(ages), 3) if ages else None,
            "admittable_mb": sum(row["memory_mb_admittable"] for row in rows),
            "reserved_mb": sum(row["reserved_mb"] for row in rows),
            "resident_mb": sum(row["resident_mb"] for row in rows),
            "committed_mb": sum(row["committed_mb"] for row in rows),
        },
        "hosts": rows,
        # This replica's own request figures: cumulative since it started (the page charts deltas).
        "requests": {
            "replica": plane.config.replica_id,
            "create_latency": _summary(_merge(latency.values())),
            "refusals": {k: int(v) for k, v in sorted(_counts(m.refusals, "reason").items())},
            "tenant_refusals": _by_tenant(m.tenant_refusals),
            "refusal_to_success": _summary(_histograms(m.refusal_to_success, None).get("", [])),
            "decision_view_age": _summary(view_age),
        },
    }


async def collect(plane: ControlPlane) -> dict[str, Any]:
    now = plane.clock.now()
    hosts = await plane.hosts()
    activity = await plane.store.host_activity(now - WINDOW_S)
    return build(hosts, activity, plane, now)
