"""Charts of experiment results. Figures are built with matplotlib's object API and rendered by its Agg
canvas: no pyplot state, no display needed, safe to call from anywhere."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from corral.sim.experiments import (
    BurstResult,
    DensityResult,
    LeakResult,
    ScaleResult,
    StalenessResult,
    WarmResult,
)

COLORS = {
    "argmax": "#ff7f0e",
    "naive": "#d62728",
    "jitter": "#ff7f0e",
    "reservations": "#9467bd",
    "power_of_2": "#1f77b4",
    "shared_ledger": "#8c564b",
    "corral": "#2ca02c",
    "random": "#7f7f7f",
    "full_scan": "#17becf",
}


def _figure(width: float, height: float) -> Figure:
    fig = Figure(figsize=(width, height))
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No software stamp: a regenerated PNG is byte-identical when nothing changed.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    return path


def _finish(fig: Figure, path: Path, *labelled: tuple[Axes, str, str]) -> Path:
    """Name each panel's axes, give it its legend, and save the figure."""
    for ax, xlabel, ylabel in labelled:
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
    return _save(fig, path)


def _burst_axes(ax: Axes, r: BurstResult) -> None:
    hosts = list(r.per_host)
    counts = [r.per_host[h] for h in hosts]
    ax.bar(range(len(hosts)), counts, color=COLORS.get(r.scenario.policy, "#333333"))
    ax.axhline(r.placed / len(hosts), color="black", lw=0.8, ls="--")
    ratio = f"{r.max_to_median:.2f}" if r.max_to_median is not None else "inf"
    ax.set_title(
        f"{r.scenario.policy}, {r.scenario.replicas} replica(s): max {r.max}, max/median {ratio}", fontsize=9
    )
    ax.set_xticks(range(len(hosts)), hosts, rotation=90, fontsize=7)
    ax.set_ylabel("creates placed")


def burst(r: BurstResult, path: Path) -> Path:
    fig = _figure(6, 3.2)
    ax = fig.subplots()
    _burst_axes(ax, r)
    return _save(fig, path)


def burst_grid(results: Sequence[BurstResult], path: Path, columns: int = 2) -> Path:
    rows = (len(results) + columns - 1) // columns
    fig = _figure(5.2 * columns, 2.6 * rows)
    axes = fig.subplots(rows, columns, sharey=True, squeeze=False)
    for ax, r in zip(axes.flat, results, strict=False):
        _burst_axes(ax, r)
    for ax in list(axes.flat)[len(results) :]:
        ax.set_visible(False)
    return _save(fig, path)


def density(r: DensityResult, path: Path) -> Path:
    fig = _figure(10, 3.4)
    ax, ax2 = fig.subplots(1, 2)
    for m, color in ((r.committed, "#d62728"), (r.working_set, "#2ca02c")):
        t = [p[0] for p in m.series]
        ax.plot(t, [p[1] for p in m.series], color=color, label=f"{m.mode}: {m.per_host:g}/host")
        ax2.plot(t, [100 * p[2] for p in m.series], color=color, label=f"{m.mode}: {m.oom_events} OOM events")
    ax2.axhline(100, color="black", lw=0.8, ls="--")
    return _finish(
        fig, path, (ax, "seconds", "sandboxes per host"), (ax2, "seconds", "physical memory used, % of fleet")
    )


def staleness(r: StalenessResult, path: Path) -> Path:
    fig = _figure(6.5, 3.8)
    ax = fig.subplots()
    for policy in r.scenario.policies:
        pts = [p for p in r.points if p.policy == policy]
        ax.plot(
            [p.mean_view_age_s for p in pts],
            [p.max_to_median for p in pts],
            marker="o",
            color=COLORS.get(policy),
            label=policy,
        )
    ax.set_yscale("log")
    return _finish(
        fig, path, (ax, "mean age of the oldest heartbeat a decision used (s)", "max-to-median host load")
    )


def scale(r: ScaleResult, path: Path) -> Path:
    fig = _figure(6.5, 3.8)
    ax = fig.subplots()
    for policy in r.scenario.policies:
        pts = [p for p in r.points if p.policy == policy]
        color = COLORS.get(policy)
        ax.plot([p.n for p in pts], [p.max_load for p in pts], marker="o", color=color, label=policy)
        th = [(p.n, p.theory) for p in pts if p.theory is not None]
        if th and policy != "full_scan":
            formula = "ln n / ln ln n" if policy == "random" else "ln ln n / ln 2"
            ax.plot([n for n, _ in th], [v for _, v in th], ls="--", color=color, label=formula)
    ax.set_xscale("log")
    return _finish(fig, path, (ax, "hosts n (n creates)", "fullest host"))


def leak(r: LeakResult, path: Path) -> Path:
    fig = _figure(6.5, 3.6)
    ax = fig.subplots()
    for run, color in ((r.lease, "#2ca02c"), (r.ttl_only, "#d62728")):
        zero = f"zero at {run.zero_at_s:g} s" if run.zero_at_s is not None else "never zero"
        ax.step(
            [t for t, _ in run.series],
            [mb / 1024 for _, mb in run.series],
            where="post",
            color=color,
            label=f"{run.variant}: {zero}",
        )
    ax.axvline(r.scenario.crash_after_s, color="black", lw=0.8, ls=":", label="replica crash")
    return _finish(fig, path, (ax, "seconds since the burst began", "outstanding reserved memory (GiB)"))


def warm(r: WarmResult, path: Path) -> Path:
    """One panel per policy: claims landed per host, warm (hits) and cold stacked."""
    fig = _figure(4.2 * len(r.outcomes), 3.4)
    hosts = sorted(r.warm_at_start)
    for i, o in enumerate(r.outcomes):
        ax = fig.add_subplot(1, len(r.outcomes), i + 1)
        cold = [o.cold_per_host.get(h, 0) for h in hosts]
        warm_ = [o.per_host.get(h, 0) - c for h, c in zip(hosts, cold, strict=True)]
        ax.bar(range(len(hosts)), warm_, color=COLORS.get(o.policy, "#333333"), label="warm")
        ax.bar(range(len(hosts)), cold, bottom=warm_, color="#d62728", label="cold")
        ax.set_title(
            f"{o.policy}: {o.hits}/{o.hits + o.misses} warm, max/mean {o.max_over_mean:.2f}", fontsize=9
        )
        ax.set_xticks(range(len(hosts)), hosts, rotation=90, fontsize=7)
        ax.set_ylabel("claims landed")
        ax.legend(fontsize=7)
    return _save(fig, path)
