"""``staleness``: max-to-median host load against the age of the view decisions use, per policy
(Mitzenmacher, "How useful is old information?", 2000).

A Poisson stream of sandboxes with exponential lifetimes keeps the fleet at a steady average load.
Hosts heartbeat every ``heartbeat_s``; each replica re-reads the store when its cache is ``view_ttl_s``
old. Hosts are large enough that admission never binds: this measures placement alone. Load is the
number of live sandboxes on a host, sampled every second after a warm-up; the x axis is the measured
mean age of the oldest heartbeat each decision leaned on.
"""

from __future__ import annotations

import asyncio
import statistics
from dataclasses import dataclass, replace
from typing import ClassVar

from corral.control.create import CreateSpec
from corral.core import CreateRequest
from corral.sim.baselines.fleet import ModelFleet, ModelFleetConfig
from corral.sim.baselines.policies import policy as policy_named
from corral.sim.experiments.result import PointsResult
from corral.sim.flow.harness import run_seeded
from corral.sim.flow.real_fleet import RealFleet, RealFleetConfig
from corral.sim.scenario import HostSpec

STALENESS_POLICIES = ("naive", "random", "power_of_2", "reservations", "corral")


@dataclass(frozen=True, slots=True)
class StalenessScenario:
    hosts: int = 50
    replicas: int = 4
    mean_load: float = 8.0  # live sandboxes per host, on average
    lifetime_mean_s: float = 60.0
    heartbeat_s: float = 1.0
    view_ttls_s: tuple[float, ...] = (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0)
    policies: tuple[str, ...] = STALENESS_POLICIES
    warmup_s: float = 120.0
    measure_s: float = 240.0
    host_memory_mb: int = 262144
    host_cpus: float = 256.0
    sandbox_mb: int = 4096

    def __post_init__(self) -> None:
        for p in self.policies:
            policy_named(p)
        if self.mean_load <= 0 or self.lifetime_mean_s <= 0:
            raise ValueError("mean_load and lifetime_mean_s must be positive")

    @property
    def rate_per_s(self) -> float:
        return self.hosts * self.mean_load / self.lifetime_mean_s


@dataclass(frozen=True, slots=True)
class StalenessPoint:
    policy: str
    view_ttl_s: float
    mean_view_age_s: float
    max_to_median: float
    mean_max: float


@dataclass(frozen=True, slots=True)
class StalenessResult(PointsResult[StalenessScenario, StalenessPoint]):
    experiment: ClassVar[str] = "staleness"


def _model_config(scn: StalenessScenario, policy: str, view_ttl_s: float) -> ModelFleetConfig:
    spec = HostSpec(memory_mb=scn.host_memory_mb, cpus=scn.host_cpus, heartbeat_s=scn.heartbeat_s)
    return ModelFleetConfig(
        hosts=scn.hosts,
        policy=policy_named(policy),
        host=spec,
        replicas=scn.replicas,
        view_ttl_s=view_ttl_s,
    )


class _Sampler:
    """Max-to-median live load, one sample a second."""

    def __init__(self) -> None:
        self.ratios: list[float] = []
        self.maxes: list[int] = []

    def sample(self, loads: list[int]) -> None:
        top = max(loads)
        med = statistics.median(loads)
        self.maxes.append(top)
        # A median host with nothing on it: count the max against one, so the ratio stays finite.
        self.ratios.append(top / max(med, 1.0))

    def point(self, policy: str, view_ttl_s: float, view_age_s: float) -> StalenessPoint:
        return StalenessPoint(
            policy=policy,
            view_ttl_s=view_ttl_s,
            mean_view_age_s=round(view_age_s, 3),
            max_to_median=round(statistics.fmean(self.ratios), 3),
            mean_max=round(statistics.fmean(self.maxes), 2),
        )


def run_real_point(scn: StalenessScenario, policy: str, view_ttl_s: float, seed: int) -> StalenessPoint:
    """Through corral's own create flow and deletes (a policy that is a configuration of corral's)."""
    model = _model_config(scn, policy, view_ttl_s)
    pol = policy_named(policy)
    host = replace(model.host, gate=pol.agent_gate, starts_limit=pol.starts_limit)
    cfg = RealFleetConfig(
        hosts=scn.hosts,
        host=host,
        replicas=scn.replicas,
        view_ttl_s=view_ttl_s,
        stale_after_s=model.stale_after,
        k=pol.control_k,
    )

    async def main() -> StalenessPoint:
        fleet = RealFleet(cfg, seed)
        await fleet.setup()
        t0 = fleet.loop.time()
        start = t0 + 2 * scn.heartbeat_s
        end = start + scn.warmup_s + scn.measure_s
        spec = CreateSpec(memory_mb=scn.sandbox_mb, cpus=1.0)
        t, n = start, 0
        while True:
            t += fleet.rng.expovariate(scn.rate_per_s)
            if t >= end:
                break
            life = fleet.rng.expovariate(1.0 / scn.lifetime_mean_s)
            fleet.background(fleet.create(spec, f"c{n}", t, life))
            n += 1
        sampler = _Sampler()
        at = start + scn.warmup_s
        while at <= end + 1e-9:
            await asyncio.sleep(at - fleet.loop.time())
            sampler.sample(fleet.live_counts())
            at += 1.0
        age, decisions = fleet.view_age()
        return sampler.point(policy, view_ttl_s, age / decisions if decisions else 0.0)

    point: StalenessPoint = run_seeded(main(), f"staleness/{seed}/{policy}/{view_ttl_s}")
    return point


def run_point(
    scn: StalenessScenario, policy: str, view_ttl_s: float, seed: int, *, on_model: bool = False
) -> StalenessPoint:
    """``on_model``: run even a configuration of corral's on the fleet model (to compare the two)."""
    if not (on_model or policy_named(policy).is_model):
        return run_real_point(scn, policy, view_ttl_s, seed)
    fleet = ModelFleet(_model_config(scn, policy, view_ttl_s), seed)
    req = CreateRequest(memory_mb=scn.sandbox_mb)
    start = 2 * scn.heartbeat_s
    end = start + scn.warmup_s + scn.measure_s
    fleet.poisson(req, scn.rate_per_s, start, end, scn.lifetime_mean_s)
    sampler = _Sampler()
    fleet.every(
        1.0, lambda now: sampler.sample([len(h.sandboxes) for h in fleet.hosts]), start + scn.warmup_s, end
    )
    fleet.run(end)
    return sampler.point(policy, view_ttl_s, fleet.metrics.mean_view_age_s)


def run(scn: StalenessScenario, seed: int = 1) -> StalenessResult:
    points = [run_point(scn, p, ttl, seed) for p in scn.policies for ttl in scn.view_ttls_s]
    return StalenessResult(scn, seed, points)
