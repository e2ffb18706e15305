"""Readable terminal output for each experiment (rich): a table, and for ``burst`` one bar per host,
so a pile-up shows as one tall bar beside empty ones."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from corral.sim.experiments import (
    BurstResult,
    DensityResult,
    FleetResult,
    LeakResult,
    ScaleResult,
    StalenessResult,
    WarmResult,
)


def _ratio(x: float | None) -> str:
    return "inf (median host got nothing)" if x is None else f"{x:.2f}"


def burst(r: BurstResult, console: Console) -> None:
    s = r.scenario
    console.print(
        f"[bold]burst[/bold]: {s.creates} creates in {s.window_s * 1000:g} ms, {s.hosts} hosts, "
        f"{s.replicas} replica(s) ({s.split}), policy [bold]{s.policy}[/bold], heartbeat {s.heartbeat_s:g} s, "
        f"view TTL {s.view_ttl_s:g} s, seed {r.seed}"
    )
    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("host")
    table.add_column("free MB", justify="right")
    table.add_column("placed", justify="right")
    table.add_column("")
    for host, n in r.per_host.items():
        table.add_row(host, str(r.free_mb_before[host]), str(n), "[green]" + "█" * n + "[/green]")
    console.print(table)
    console.print(
        f"max {r.max}  median {r.median:g}  max/median {_ratio(r.max_to_median)}  placed {r.placed}"
    )
    refusals = ", ".join(f"{k} {v}" for k, v in r.refusals.items()) or "none"
    console.print(f"refusals: {refusals}")


def density(r: DensityResult, console: Console) -> None:
    s = r.scenario
    console.print(
        f"[bold]density[/bold]: {s.hosts} hosts of {s.host_memory_mb} MB, {s.sandbox_mb} MB sandboxes touching "
        f"~{s.working_set_mb} MB, {s.rate_per_s:g} creates/s for {s.duration_s:g} s, seed {r.seed}, "
        f"engine {r.as_json()['engine']}"
    )
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("admission", "per host", "OOM events", "resident/committed", "refused creates"):
        table.add_column(col, justify="right")
    for m in (r.committed, r.working_set):
        refused = sum(v for k, v in m.refusals.items() if k != "gave_up")
        table.add_row(
            m.mode, f"{m.per_host:g}", str(m.oom_events), f"{m.resident_to_committed:.3f}", str(refused)
        )
    console.print(table)
    if r.committed.per_host:
        console.print(
            f"working-set fits {r.working_set.per_host / r.committed.per_host:.1f}x as many per host"
        )


def staleness(r: StalenessResult, console: Console) -> None:
    s = r.scenario
    console.print(
        f"[bold]staleness[/bold]: {s.hosts} hosts, {s.replicas} replicas, mean load {s.mean_load:g}/host, "
        f"heartbeat {s.heartbeat_s:g} s, seed {r.seed}: max-to-median load by view TTL"
    )
    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("policy")
    for ttl in s.view_ttls_s:
        table.add_column(f"ttl {ttl:g}s", justify="right")
    for policy in s.policies:
        pts = {p.view_ttl_s: p for p in r.points if p.policy == policy}
        table.add_row(policy, *(f"{pts[t].max_to_median:.2f}" for t in s.view_ttls_s if t in pts))
    console.print(table)
    ages = {p.view_ttl_s: p.mean_view_age_s for p in r.points if p.policy == s.policies[0]}
    console.print(
        f"mean view age ({s.policies[0]}): " + ", ".join(f"ttl {t:g}s -> {a:.1f}s" for t, a in ages.items())
    )


def scale(r: ScaleResult, console: Console) -> None:
    console.print(f"[bold]scale[/bold]: fullest host after n creates on n hosts, seed {r.seed}")
    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("n", justify="right")
    for policy in r.scenario.policies:
        table.add_column(policy, justify="right")
        if policy != "full_scan":
            table.add_column("theory", justify="right", style="dim")
    by = {(p.policy, p.n): p for p in r.points}
    for n in r.scenario.ns:
        row = [str(n)]
        for policy in r.scenario.policies:
            p = by.get((policy, n))
            row.append(f"{p.max_load:g}" if p else "-")
            if policy != "full_scan":
                row.append(f"{p.theory:.2f}" if p and p.theory is not None else "-")
        table.add_row(*row)
    console.print(table)


def fleet_scale(r: FleetResult, console: Console) -> None:
    s = r.scenario
    console.print(
        f"[bold]scale[/bold]: {s.hosts:,} hosts, {s.sandboxes:,} sandboxes, churn {s.churn_per_s:g}/s, "
        f"heartbeat {s.heartbeat_s:g} s, {s.duration_s:g} s simulated, seed {r.seed}: "
        f"{r.heartbeats:,} heartbeats, {r.creates:,} creates, {r.deletes:,} deletes"
    )
    changes, full = r.designs
    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("per second of simulated time")
    table.add_column("changes + digest", justify="right")
    table.add_column("full id list", justify="right")
    for kind in changes.writes_per_s:
        table.add_row(
            f"{kind} written", f"{changes.writes_per_s[kind]:,.1f}", f"{full.writes_per_s[kind]:,.1f}"
        )
    table.add_row(
        "listing ids written",
        f"{changes.listing_ids_written_per_s:,.0f}",
        f"{full.listing_ids_written_per_s:,.0f}",
    )
    table.add_row("wire bytes", f"{changes.wire_bytes_per_s:,.0f}", f"{full.wire_bytes_per_s:,.0f}")
    table.add_row(
        "wire bytes per heartbeat",
        f"{changes.wire_bytes_per_heartbeat:,.0f}",
        f"{full.wire_bytes_per_heartbeat:,.0f}",
    )
    console.print(table)
    rows = Table(show_header=True, header_style="bold", box=None)
    rows.add_column("rows held")
    rows.add_column("changes + digest", justify="right")
    rows.add_column("full id list", justify="right")
    for table_name in dict.fromkeys([*changes.rows, *full.rows]):
        rows.add_row(
            table_name,
            f"{changes.rows[table_name]:,}" if table_name in changes.rows else "-",
            f"{full.rows[table_name]:,}" if table_name in full.rows else "-",
        )
    console.print(rows)


def leak(r: LeakResult, console: Console) -> None:
    s = r.scenario
    console.print(
        f"[bold]leak[/bold]: replica r{s.crash_replica} of {s.burst.replicas} dies {s.crash_after_s:g} s into a "
        f"{s.burst.creates}-create burst (lease {s.lease_s:g} s, ledger TTL {s.ledger_ttl_s:g} s), seed {r.seed}"
    )
    table = Table(show_header=True, header_style="bold", box=None)
    for col in ("variant", "held by dead MB", "peak MB", "final MB", "zero from (s)"):
        table.add_column(col, justify="right")
    for run in (r.lease, r.ttl_only):
        zero = f"{run.zero_at_s:g}" if run.zero_at_s is not None else "never"
        table.add_row(run.variant, str(run.held_by_dead_mb), str(run.peak_mb), str(run.final_mb), zero)
    console.print(table)


def warm(r: WarmResult, console: Console) -> None:
    s = r.scenario
    console.print(
        f"[bold]warm[/bold]: {s.claims} claims in {s.window_s:g}s over {s.hosts} hosts holding "
        f"{sum(r.warm_at_start.values())} warm, inventory refreshed every {s.refresh_s:g}s, "
        f"{s.replicas} replica(s), seed {r.seed}"
    )
    table = Table(show_header=True, header_style="bold", box=None)
    for column in (
        "policy",
        "engine",
        "hits",
        "misses",
        "max/mean",
        "hosts cold",
        "most cold on one",
        "drained",
        "asked",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for o in r.outcomes:
        table.add_row(
            o.policy,
            o.engine,
            str(o.hits),
            str(o.misses),
            f"{o.max_over_mean:.2f}",
            str(o.hosts_with_cold),
            str(max(o.cold_per_host.values(), default=0)),
            str(o.drained),
            str(o.asked),
        )
    console.print(table)
