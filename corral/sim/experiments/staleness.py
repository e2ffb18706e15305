"""``staleness``: max-to-median host load against the age of the view decisions use, per policy
(Mitzenmacher, "How useful is old information?", 2000).

A Poisson stream of sandboxes with exponential lifetimes keeps the fleet at a steady average load.
Hosts heartbeat every ``heartbeat_s``; each replica re-reads the store when its cache is ``view_ttl_s``
old. Hosts are large enough that admission never binds: this measures placement alone. Load is the
number of live sandboxes on a host, sampled every second after a warm-up; the x axis is the measured
mean age of the oldest heartbeat each decision leaned on.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import Any

from corral.core import CreateRequest
from corral.sim.fleet import Fleet, FleetConfig
from corral.sim.host import HostSpec
from corral.sim.policies import policy as policy_named

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
class StalenessResult:
    scenario: StalenessScenario
    seed: int
    points: list[StalenessPoint]

    def as_json(self) -> dict[str, Any]:
        return {
            "experiment": "staleness",
            "seed": self.seed,
            "scenario": asdict(self.scenario),
            "points": [asdict(p) for p in self.points],
        }


def run_point(scn: StalenessScenario, policy: str, view_ttl_s: float, seed: int) -> StalenessPoint:
    spec = HostSpec(memory_mb=scn.host_memory_mb, cpus=scn.host_cpus, heartbeat_s=scn.heartbeat_s)
    fleet = Fleet(
        FleetConfig(
            hosts=scn.hosts,
            policy=policy_named(policy),
            host=spec,
            replicas=scn.replicas,
            view_ttl_s=view_ttl_s,
        ),
        seed,
    )
    req = CreateRequest(memory_mb=scn.sandbox_mb)
    start = 2 * scn.heartbeat_s
    end = start + scn.warmup_s + scn.measure_s
    fleet.poisson(req, scn.rate_per_s, start, end, scn.lifetime_mean_s)
    ratios: list[float] = []
    maxes: list[int] = []

    def sample(now: float) -> None:
        loads = [len(h.sandboxes) for h in fleet.hosts]
        top = max(loads)
        med = statistics.median(loads)
        maxes.append(top)
        # A median host with nothing on it: count the max against one, so the ratio stays finite.
        ratios.append(top / max(med, 1.0))

    fleet.every(1.0, sample, start + scn.warmup_s, end)
    fleet.run(end)
    return StalenessPoint(
        policy=policy,
        view_ttl_s=view_ttl_s,
        mean_view_age_s=round(fleet.metrics.mean_view_age_s, 3),
        max_to_median=round(statistics.fmean(ratios), 3),
        mean_max=round(statistics.fmean(maxes), 2),
    )


def run(scn: StalenessScenario, seed: int = 1) -> StalenessResult:
    points = [run_point(scn, p, ttl, seed) for p in scn.policies for ttl in scn.view_ttls_s]
    return StalenessResult(scn, seed, points)
