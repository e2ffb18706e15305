"""What ``corral top`` draws: the dashboard's document as a rich renderable (pure: a document in, a
renderable out; the command fetches and redraws)."""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

DATA_PATH = "/dashboard/data.json"


def _n(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) or digits else str(value)


def render(doc: dict[str, Any]) -> RenderableType:
    f, r = doc["fleet"], doc["requests"]
    lat, r2s = r["create_latency"], r["refusal_to_success"]
    refusals = ", ".join(f"{k} {v}" for k, v in r["refusals"].items()) or "none"
    by_tenant = "; ".join(
        f"{t}: " + ", ".join(f"{k} {v}" for k, v in reasons.items())
        for t, reasons in r.get("tenant_refusals", {}).items()
    )
    head = Text.assemble(
        ("corral top", "bold"),
        f"  {f['hosts']} hosts, {f['sandboxes']} sandboxes, max/median {f['max']}/{_n(f['median'], 1)}",
        f", placed {f['placements_60s']} in {doc['window_s']:g} s, view age {_n(f['view_age_s'], 1)} s\n",
        f"replica {r['replica']}: create p50/p99 {_n(lat['p50_ms'], 1)}/{_n(lat['p99_ms'], 1)} ms",
        f", refusals {refusals}, refusal to success p50/p99 {_n(r2s['p50_ms'], 0)}/{_n(r2s['p99_ms'], 0)} ms",
        f"\nrefused by tenant: {by_tenant}" if by_tenant else "",
    )
    table = Table(box=None, pad_edge=False)
    # heartbeat age s, sandboxes, placed in the window, then MiB: admittable, reserved, resident,
    # committed; create latency ms
    columns = ("host", "state", "hb", "n", "60s", "admit", "resv", "res", "comm", "p50/p99")
    for c in columns:
        table.add_column(c, justify="left" if c in ("host", "state") else "right", no_wrap=True)
    biggest = f["max"]
    for h in doc["hosts"]:
        hl = h["create_latency"]
        table.add_row(
            h["id"],
            h["state"],
            _n(h["heartbeat_age_s"], 1),
            Text(str(h["sandboxes"]), style="bold red" if biggest and h["sandboxes"] == biggest else ""),
            str(h["placements_60s"]),
            str(h["memory_mb_admittable"]),
            str(h["reserved_mb"]),
            str(h["resident_mb"]),
            str(h["committed_mb"]),
            f"{_n(hl['p50_ms'], 1)}/{_n(hl['p99_ms'], 1)}",
        )
    return Group(head, table)
