"""``leak``: a replica dies mid-burst holding reservations in the shared ledger. Outstanding reserved
memory must return to zero: through the dead replica's lease (its claims are dropped together), or,
without a lease, only when each claim's TTL runs out.

Live replicas release their claims once a heartbeat accounting for the sandbox has reached every view;
the dead one never will, which is the leak the lease and the TTL exist for.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from corral.control.create import CreateSpec
from corral.core import CreateRequest
from corral.sim.baselines.policies import policy as policy_named
from corral.sim.experiments.burst import BurstScenario, build, build_real, burst_times, real_config
from corral.sim.flow.harness import run_seeded
from corral.sim.flow.real_fleet import RealFleet


@dataclass(frozen=True, slots=True)
class LeakScenario:
    burst: BurstScenario = field(default_factory=lambda: BurstScenario(replicas=4, policy="corral"))
    crash_replica: int = 1
    crash_after_s: float = 0.1  # after the burst begins: mid-burst
    lease_s: float = 10.0
    ledger_ttl_s: float = 120.0
    observe_s: float = 160.0
    sample_s: float = 0.5

    def __post_init__(self) -> None:
        if not 0 <= self.crash_replica < self.burst.replicas:
            raise ValueError("crash_replica must name one of the burst's replicas")
        if self.burst.policy not in ("corral", "shared_ledger"):
            raise ValueError("leak needs a policy with a shared ledger (corral or shared_ledger)")


@dataclass(frozen=True, slots=True)
class LeakRun:
    variant: str  # "lease" or "ttl_only"
    series: list[tuple[float, int]]  # (seconds since the burst began, outstanding reserved MB)
    held_by_dead_mb: int  # what the dead replica held just after it died
    peak_mb: int
    final_mb: int
    zero_at_s: float | None  # from when on outstanding stayed at zero
    placed: int


@dataclass(frozen=True, slots=True)
class LeakResult:
    scenario: LeakScenario
    seed: int
    lease: LeakRun
    ttl_only: LeakRun

    def as_json(self) -> dict[str, Any]:
        runs = {r.variant: r for r in (self.lease, self.ttl_only)}
        return {
            "experiment": "leak",
            "seed": self.seed,
            "scenario": asdict(self.scenario),
            "engine": policy_named(self.scenario.burst.policy).engine,
            "held_by_dead_mb": {k: r.held_by_dead_mb for k, r in runs.items()},
            "peak_mb": {k: r.peak_mb for k, r in runs.items()},
            "final_mb": {k: r.final_mb for k, r in runs.items()},
            "zero_at_s": {k: r.zero_at_s for k, r in runs.items()},
            "placed": {k: r.placed for k, r in runs.items()},
            "series": {k: r.series for k, r in runs.items()},
        }


def _zero_at(series: list[tuple[float, int]]) -> float | None:
    """From when on outstanding stayed at zero."""
    zero_at: float | None = None
    for t, mb in reversed(series):
        if mb != 0:
            break
        zero_at = t
    return zero_at


def run_real(scn: LeakScenario, lease: bool, seed: int) -> LeakRun:
    """Through corral's own create flow: every replica runs its reconciler, whose leader ends a dead
    owner's reservations once its store lease lapses (``lease``) or each one at its TTL (a lease longer
    than the TTL stands for none)."""
    burst = replace(scn.burst, lease_s=scn.lease_s if lease else None, ledger_ttl_s=scn.ledger_ttl_s)

    async def main() -> LeakRun:
        fleet = RealFleet(real_config(burst, reconcile=True), seed)
        build_real(fleet, burst)
        await fleet.setup()
        hb_max = burst.heartbeat_s * (1 + burst.heartbeat_jitter)
        t0 = fleet.loop.time()
        start = t0 + hb_max + burst.view_ttl_s
        fleet.warm_views(t0 + hb_max, start)
        series: list[tuple[float, int]] = []

        async def sample() -> None:
            t = start - 1.0
            while t <= start + scn.observe_s + 1e-9:
                await asyncio.sleep(t - fleet.loop.time())
                series.append((round(t - start, 3), fleet.outstanding_mb()))
                t += scn.sample_s

        sampler = fleet.loop.create_task(sample())
        await asyncio.sleep(start - fleet.loop.time())
        spec = CreateSpec(memory_mb=burst.sandbox_mb, cpus=burst.sandbox_cpu)
        creates = asyncio.gather(
            *(fleet.create(spec, f"c{i}", at) for i, at in enumerate(burst_times(burst, fleet, start)))
        )
        await asyncio.sleep(scn.crash_after_s)
        dead = fleet.replicas[scn.crash_replica]
        dead.crash()
        held = fleet.held_by(dead.id)
        await creates
        await sampler
        return LeakRun(
            variant="lease" if lease else "ttl_only",
            series=series,
            held_by_dead_mb=held,
            peak_mb=max(mb for _, mb in series),
            final_mb=series[-1][1],
            zero_at_s=_zero_at(series),
            placed=fleet.tally.placed,
        )

    result: LeakRun = run_seeded(main(), f"leak/{seed}/{lease}")
    return result


def run_variant(scn: LeakScenario, lease: bool, seed: int, *, on_model: bool = False) -> LeakRun:
    if not (on_model or policy_named(scn.burst.policy).is_model):
        return run_real(scn, lease, seed)
    burst = replace(scn.burst, lease_s=scn.lease_s if lease else None, ledger_ttl_s=scn.ledger_ttl_s)
    fleet = build(burst, seed)
    hb_max = burst.heartbeat_s * (1 + burst.heartbeat_jitter)
    start = hb_max + burst.view_ttl_s
    fleet.warm_views(hb_max, start)
    fleet.burst(
        CreateRequest(memory_mb=burst.sandbox_mb, cpu=burst.sandbox_cpu), burst.creates, start, burst.window_s
    )
    crash_at = start + scn.crash_after_s
    fleet.crash_replica(scn.crash_replica, crash_at)
    ledger = fleet.shared_ledger
    assert ledger is not None  # the scenario checks the policy
    dead_id = fleet.replicas[scn.crash_replica].id
    held: list[int] = []
    fleet.loop.at(crash_at, lambda: held.append(sum(r.memory_mb for r in ledger.owned_by(dead_id))))
    series: list[tuple[float, int]] = []
    fleet.every(
        scn.sample_s,
        lambda now: series.append((round(now - start, 3), ledger.outstanding_mb())),
        start - 1.0,
        start + scn.observe_s,
    )
    fleet.run(start + scn.observe_s)
    return LeakRun(
        variant="lease" if lease else "ttl_only",
        series=series,
        held_by_dead_mb=held[0] if held else 0,
        peak_mb=max(mb for _, mb in series),
        final_mb=series[-1][1],
        zero_at_s=_zero_at(series),
        placed=fleet.metrics.placed,
    )


def run(scn: LeakScenario, seed: int = 1, *, on_model: bool = False) -> LeakResult:
    """``on_model``: run even a configuration of corral's on the fleet model (to compare the two)."""
    return LeakResult(
        scn,
        seed,
        run_variant(scn, True, seed, on_model=on_model),
        run_variant(scn, False, seed, on_model=on_model),
    )
