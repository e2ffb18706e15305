"""``corral sim <experiment>``: run one experiment and print a readable table (or, with ``--json``, one
JSON object on stdout), optionally writing its chart with ``--plot FILE.png``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import typer
from rich.console import Console

from corral.codes import ErrorCode
from corral.sim.baselines.policies import BURST_POLICIES
from corral.sim.experiments import (
    BurstScenario,
    DensityScenario,
    FleetScenario,
    LeakScenario,
    ScaleScenario,
    StalenessScenario,
    WarmScenario,
)
from corral.sim.experiments import burst as burst_exp
from corral.sim.experiments import density as density_exp
from corral.sim.experiments import fleet_scale as fleet_exp
from corral.sim.experiments import leak as leak_exp
from corral.sim.experiments import scale as scale_exp
from corral.sim.experiments import staleness as staleness_exp
from corral.sim.experiments import warm as warm_exp
from corral.sim.report import plots, render

sim_app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="Deterministic fleet simulations driving corral's own placement and admission code.",
)


class _Result(Protocol):
    def as_json(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=_Result)

SEED = typer.Option(1, "--seed", help="Same seed, same result.")
JSON = typer.Option(False, "--json", help="Print one JSON object on stdout.")
PLOT = typer.Option(None, "--plot", help="Write the chart to this PNG file.", dir_okay=False)


def _fail(message: str, as_json: bool) -> None:
    """Bad input: a stable code, a clear message, exit status 2."""
    if as_json:
        typer.echo(json.dumps({"error": {"code": ErrorCode.INVALID_SCENARIO, "message": message}}))
    else:
        typer.echo(f"invalid_scenario: {message}", err=True)
    raise typer.Exit(2)


def _run(
    make: Callable[[], Any],
    run: Callable[[Any, int], R],
    seed: int,
    as_json: bool,
    plot: Path | None,
    draw: Callable[[R, Path], Path],
    show: Callable[[R, Console], None],
) -> None:
    try:
        scenario = make()
    except ValueError as exc:
        _fail(str(exc), as_json)
        return
    result = run(scenario, seed)
    if plot is not None:
        draw(result, plot)
    if as_json:
        sys.stdout.write(json.dumps(result.as_json()) + "\n")
    else:
        console = Console()
        show(result, console)
        if plot is not None:
            console.print(f"chart written to {plot}")


def _floats(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated numbers, got {text!r}") from None


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@sim_app.command()
def burst(
    hosts: int = typer.Option(12, help="Hosts in the fleet."),
    creates: int = typer.Option(50, help="Concurrent creates in the burst."),
    replicas: int = typer.Option(1, help="Scheduler replicas sharing the burst."),
    policy: str = typer.Option("corral", help=f"One of: {', '.join(BURST_POLICIES)}."),
    heartbeat_s: float = typer.Option(10.0, help="Agent heartbeat interval (jittered +/-10%)."),
    view_ttl_s: float = typer.Option(30.0, help="How long a replica caches its view of the fleet."),
    window_s: float = typer.Option(0.2, help="The burst arrives within this many seconds."),
    gap_mb: int = typer.Option(300, help="Free-memory step between consecutive hosts."),
    split: str = typer.Option("round_robin", help="round_robin or random split across replicas."),
    starts_limit: int | None = typer.Option(None, help="Override the policy's agent starts limiter."),
    fresh_host: bool = typer.Option(False, help="One host joins empty."),
    stale_after_s: float | None = typer.Option(
        None, help="Heartbeat age beyond which a host is skipped (default: view TTL + 3 heartbeats)."
    ),
    seed: int = SEED,
    as_json: bool = JSON,
    plot: Path | None = PLOT,
) -> None:
    """N concurrent creates against a fleet seen through a seconds-old view: do they pile onto one host?"""
    _run(
        lambda: BurstScenario(
            hosts=hosts,
            creates=creates,
            replicas=replicas,
            policy=policy,
            heartbeat_s=heartbeat_s,
            view_ttl_s=view_ttl_s,
            window_s=window_s,
            gap_mb=gap_mb,
            split=split,
            starts_limit=starts_limit,
            fresh_host=fresh_host,
            stale_after_s=stale_after_s,
        ),
        burst_exp.run,
        seed,
        as_json,
        plot,
        plots.burst,
        render.burst,
    )


@sim_app.command()
def density(
    hosts: int = typer.Option(4, help="Hosts in the fleet."),
    working_set_mb: int = typer.Option(300, help="What a sandbox touches, on average."),
    spike_probability: float = typer.Option(0.0, help="Fraction of sandboxes that spike for a while."),
    rate_per_s: float = typer.Option(2.0, help="Offered creates per second (fleet-wide)."),
    duration_s: float = typer.Option(600.0, help="How long creates are offered."),
    seed: int = SEED,
    as_json: bool = JSON,
    plot: Path | None = PLOT,
) -> None:
    """Idle sandboxes per 32 GiB host under committed vs working-set admission, and the OOMs each causes."""
    _run(
        lambda: DensityScenario(
            hosts=hosts,
            working_set_mb=working_set_mb,
            spike_probability=spike_probability,
            rate_per_s=rate_per_s,
            duration_s=duration_s,
        ),
        density_exp.run,
        seed,
        as_json,
        plot,
        plots.density,
        render.density,
    )


@sim_app.command()
def staleness(
    hosts: int = typer.Option(50, help="Hosts in the fleet."),
    replicas: int = typer.Option(4, help="Scheduler replicas."),
    view_ttls: str = typer.Option("0,1,2,5,10,20,40", help="View TTLs to sweep, seconds."),
    policies: str = typer.Option(",".join(staleness_exp.STALENESS_POLICIES), help="Policies to compare."),
    measure_s: float = typer.Option(240.0, help="Seconds measured after the warm-up."),
    seed: int = SEED,
    as_json: bool = JSON,
    plot: Path | None = PLOT,
) -> None:
    """Max-to-median host load against view age, per policy (Mitzenmacher's old information)."""
    _run(
        lambda: StalenessScenario(
            hosts=hosts,
            replicas=replicas,
            view_ttls_s=_floats(view_ttls),
            policies=_names(policies),
            measure_s=measure_s,
        ),
        staleness_exp.run,
        seed,
        as_json,
        plot,
        plots.staleness,
        render.staleness,
    )


@sim_app.command()
def scale(
    ns: str = typer.Option("16,64,256,1024,4096,16384,65536", help="Fleet sizes n (n creates each)."),
    trials: int = typer.Option(3, help="Runs per point, averaged."),
    full_scan_max_n: int = typer.Option(1024, help="Largest n for the O(n) full scan."),
    hosts: int | None = typer.Option(
        None, help="Instead: run this many hosts and report store rows and writes per second."
    ),
    sandboxes: int = typer.Option(1_000_000, help="With --hosts: sandboxes across the fleet."),
    churn_per_s: float = typer.Option(300.0, help="With --hosts: creates (and deletes) per second."),
    duration_s: float = typer.Option(60.0, help="With --hosts: seconds of simulated time."),
    heartbeat_s: float = typer.Option(
        fleet_exp.DEFAULT_HEARTBEAT_S, help="With --hosts: heartbeat interval."
    ),
    seed: int = SEED,
    as_json: bool = JSON,
    plot: Path | None = PLOT,
) -> None:
    """Fullest host vs n for random, power-of-2 and a full scan (balls and bins); with --hosts, the
    store's rows and writes per second at fleet size, changes-only heartbeats beside full lists."""
    if hosts is not None:
        try:
            fleet = FleetScenario(
                hosts=hosts,
                sandboxes=sandboxes,
                churn_per_s=churn_per_s,
                duration_s=duration_s,
                heartbeat_s=heartbeat_s,
            )
        except ValueError as exc:
            _fail(str(exc), as_json)
            return
        result = fleet_exp.run(fleet, seed)
        if as_json:
            sys.stdout.write("".join(json.dumps(line) + "\n" for line in result.json_lines()))
        else:
            render.fleet_scale(result, Console())
        return
    _run(
        lambda: ScaleScenario(ns=_ints(ns), trials=trials, full_scan_max_n=full_scan_max_n),
        scale_exp.run,
        seed,
        as_json,
        plot,
        plots.scale,
        render.scale,
    )


@sim_app.command()
def leak(
    hosts: int = typer.Option(12, help="Hosts in the fleet."),
    creates: int = typer.Option(50, help="Creates in the burst."),
    replicas: int = typer.Option(4, help="Scheduler replicas sharing one ledger."),
    crash_replica: int = typer.Option(1, help="Index of the replica that dies."),
    crash_after_s: float = typer.Option(0.1, help="Seconds into the burst when it dies."),
    lease_s: float = typer.Option(10.0, help="The replica's lease."),
    ledger_ttl_s: float = typer.Option(120.0, help="Reservation TTL, the last resort."),
    seed: int = SEED,
    as_json: bool = JSON,
    plot: Path | None = PLOT,
) -> None:
    """A replica dies mid-burst holding reservations; outstanding reserved memory returns to zero."""
    _run(
        lambda: LeakScenario(
            burst=BurstScenario(hosts=hosts, creates=creates, replicas=replicas, policy="corral"),
            crash_replica=crash_replica,
            crash_after_s=crash_after_s,
            lease_s=lease_s,
            ledger_ttl_s=ledger_ttl_s,
        ),
        leak_exp.run,
        seed,
        as_json,
        plot,
        plots.leak,
        render.leak,
    )


@sim_app.command()
def warm(
    hosts: int = typer.Option(12, help="Hosts holding warm sandboxes."),
    warm_min: int = typer.Option(8, help="Fewest warm sandboxes on a host at the start."),
    warm_max: int = typer.Option(12, help="Most warm sandboxes on a host at the start."),
    claims: int = typer.Option(100, help="Claims in the burst."),
    window_s: float = typer.Option(1.0, help="The burst arrives within this many seconds."),
    refresh_s: float = typer.Option(10.0, help="How often the advertised inventory is refreshed."),
    replicas: int = typer.Option(1, help="Replicas sharing the burst (each knows its own claims)."),
    policies: str = typer.Option(",".join(warm_exp.WARM_POLICIES), help="Policies to compare."),
    refill: bool = typer.Option(False, help="corral's agents refill their pools during the burst."),
    seed: int = SEED,
    as_json: bool = JSON,
    plot: Path | None = PLOT,
) -> None:
    """A burst of warm claims over a stale inventory: argmax drains one host, corral's claim path does not."""
    _run(
        lambda: WarmScenario(
            hosts=hosts,
            warm_min=warm_min,
            warm_max=warm_max,
            claims=claims,
            window_s=window_s,
            refresh_s=refresh_s,
            replicas=replicas,
            policies=_names(policies),
            refill=refill,
        ),
        warm_exp.run,
        seed,
        as_json,
        plot,
        plots.warm,
        render.warm,
    )


@sim_app.command()
def chaos(
    seeds: int = typer.Option(0, "--seeds", help="Run this many seeds, from --start."),
    start: int = typer.Option(0, "--start", help="The first seed of --seeds."),
    seed: int | None = typer.Option(None, "--seed", help="Run this one seed."),
    replay: bool = typer.Option(False, "--replay", help="With --seed: print the run's event trace."),
    jobs: int = typer.Option(1, "--jobs", help="Processes running seeds side by side."),
) -> None:
    """The real create flow, batch creates, reconciler and failover under injected faults, on virtual
    time; invariants checked after every step. A failing seed prints the command that replays it."""
    if (seed is None) == (seeds <= 0):
        _fail("give either --seeds N or --seed S", False)
    if jobs < 1:
        _fail("--jobs must be at least 1", False)
    if os.environ.get("PYTHONHASHSEED") != "0":
        # Sets of strings iterate in an order fixed by the hash seed: a replay needs the same one.
        args = ["--seed", str(seed)] if seed is not None else ["--seeds", str(seeds), "--start", str(start)]
        args += ["--replay"] if replay else []
        args += ["--jobs", str(jobs)]
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        done = subprocess.run([sys.executable, "-m", "corral", "sim", "chaos", *args], env=env, check=False)
        raise typer.Exit(done.returncode)
    from corral.sim.flow import chaos as chaos_mod

    if seed is not None:
        result = chaos_mod.run_seed(seed)
        if replay:
            for line in result.trace:
                typer.echo(line)
        typer.echo(json.dumps(chaos_mod.summary([result], 0.0, one=True)))
        raise typer.Exit(0 if result.ok else 1)
    began = time.perf_counter()
    results = []
    for result in chaos_mod.run_many(range(start, start + seeds), jobs):
        results.append(result)
        for v in result.violations:
            typer.echo(
                f"seed {result.seed}: {v.invariant} at {v.at:.3f}s: {v.detail}\n"
                f"  replay: {chaos_mod.replay_command(result.seed)}"
            )
    out = chaos_mod.summary(results, time.perf_counter() - began)
    typer.echo(json.dumps(out))
    raise typer.Exit(0 if not out["failed"] else 1)
