"""``burst``: N concurrent creates against a fleet whose view is seconds old: every replica scores the same
stale numbers, so without a fix they all pick the same host.

Hosts start with free memory a few hundred MB apart, as in a real fleet, so scores strictly order and
a deterministic scorer has a single winner. The burst arrives within ``window_s``, far inside one
heartbeat interval and one view TTL.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import asdict, dataclass, replace
from typing import Any

from corral.control.create import CreateSpec
from corral.core import CreateRequest
from corral.sim.baselines.fleet import ModelFleet, ModelFleetConfig, counts_for
from corral.sim.baselines.policies import policy as policy_named
from corral.sim.flow.harness import run_seeded
from corral.sim.flow.real_fleet import RealFleet, RealFleetConfig
from corral.sim.scenario import HostSpec

PRELOAD_SANDBOXES = 4  # the fleet's existing load on each host, already measured


@dataclass(frozen=True, slots=True)
class BurstScenario:
    hosts: int = 12
    creates: int = 50
    replicas: int = 1
    policy: str = "corral"
    heartbeat_s: float = 10.0
    heartbeat_jitter: float = 0.1
    view_ttl_s: float = 30.0
    window_s: float = 0.2
    host_memory_mb: int = 32768
    host_cpus: float = 16.0
    # Existing resident memory on the emptiest host, and the step between consecutive hosts.
    base_used_mb: int = 8192
    gap_mb: int = 300
    sandbox_mb: int = 4096
    sandbox_cpu: float = 1.0
    split: str = "round_robin"
    # Override the policy's agent starts limiter (None: the policy's own).
    starts_limit: int | None = None
    # One host (chosen by the seed) joins empty: the case where per-replica ledgers pile up.
    fresh_host: bool = False
    # Shared-ledger reservations of a dead replica end with its lease, or at the TTL (last resort).
    lease_s: float | None = 10.0
    ledger_ttl_s: float = 120.0
    # None: view_ttl_s + 3 heartbeats (see ModelFleetConfig); a common production cutoff is 30 s.
    stale_after_s: float | None = None

    def __post_init__(self) -> None:
        policy_named(self.policy)
        if self.creates < 1 or self.window_s < 0 or self.gap_mb < 0:
            raise ValueError("creates must be >= 1, window_s and gap_mb must not be negative")


@dataclass(frozen=True, slots=True)
class BurstResult:
    scenario: BurstScenario
    seed: int
    per_host: dict[str, int]
    refusals: dict[str, int]
    placed: int
    mean_view_age_s: float
    free_mb_before: dict[str, int]
    outstanding_mb_after: int
    # Creates refused at least once before they were placed, and the longest such wait.
    refused_then_placed: int = 0
    max_wait_s: float = 0.0

    @property
    def max(self) -> int:
        return max(self.per_host.values())

    @property
    def median(self) -> float:
        return float(statistics.median(self.per_host.values()))

    @property
    def max_to_median(self) -> float | None:
        """None when the median host got nothing: the ratio is unbounded."""
        return self.max / self.median if self.median > 0 else None

    def as_json(self) -> dict[str, Any]:
        return {
            "experiment": "burst",
            "seed": self.seed,
            "policy": self.scenario.policy,
            "engine": policy_named(self.scenario.policy).engine,
            "scenario": asdict(self.scenario),
            "per_host": self.per_host,
            "max": self.max,
            "median": self.median,
            "max_to_median": self.max_to_median,
            "placed": self.placed,
            "refusals": self.refusals,
            "mean_view_age_s": round(self.mean_view_age_s, 3),
            "free_mb_before": self.free_mb_before,
            "outstanding_mb_after": self.outstanding_mb_after,
            "refused_then_placed": self.refused_then_placed,
            "max_wait_s": round(self.max_wait_s, 3),
        }


def preload_plan(scn: BurstScenario, rng: random.Random) -> list[int | None]:
    """Each host's existing resident memory (None: the fresh host, which joins empty)."""
    ranks = list(range(scn.hosts))
    rng.shuffle(ranks)
    fresh = rng.randrange(scn.hosts) if scn.fresh_host else None
    jitter = scn.gap_mb // 4
    return [
        None if i == fresh else scn.base_used_mb + rank * scn.gap_mb + rng.randint(-jitter, jitter)
        for i, rank in enumerate(ranks)
    ]


def host_spec(scn: BurstScenario) -> HostSpec:
    pol = policy_named(scn.policy)
    return HostSpec(
        memory_mb=scn.host_memory_mb,
        cpus=scn.host_cpus,
        heartbeat_s=scn.heartbeat_s,
        heartbeat_jitter=scn.heartbeat_jitter,
        gate=pol.agent_gate,
        starts_limit=scn.starts_limit if scn.starts_limit is not None else pol.starts_limit,
    )


def build(scn: BurstScenario, seed: int) -> ModelFleet:
    """The fleet model, for the policies that model other schedulers."""
    pol = policy_named(scn.policy)
    if scn.starts_limit is not None:
        pol = replace(pol, starts_limit=scn.starts_limit)
    spec = host_spec(scn)
    fleet = ModelFleet(
        ModelFleetConfig(
            hosts=scn.hosts,
            policy=pol,
            host=spec,
            replicas=scn.replicas,
            view_ttl_s=scn.view_ttl_s,
            split=scn.split,
            lease_s=scn.lease_s,
            ledger_ttl_s=scn.ledger_ttl_s,
            stale_after_s=scn.stale_after_s,
        ),
        seed,
    )
    for i, used in enumerate(preload_plan(scn, fleet.stream("preload"))):
        if used is None:
            continue
        for _ in range(PRELOAD_SANDBOXES):
            fleet.hosts[i].preload(fleet.new_id(), scn.sandbox_mb, used // PRELOAD_SANDBOXES, 1.0, 0.0)
    return fleet


def real_config(scn: BurstScenario, **changes: Any) -> RealFleetConfig:
    spec = host_spec(scn)
    model = ModelFleetConfig(
        hosts=scn.hosts,
        policy=policy_named(scn.policy),
        host=spec,
        view_ttl_s=scn.view_ttl_s,
        stale_after_s=scn.stale_after_s,
    )
    return RealFleetConfig(
        hosts=scn.hosts,
        host=spec,
        replicas=scn.replicas,
        view_ttl_s=scn.view_ttl_s,
        stale_after_s=model.stale_after,
        k=policy_named(scn.policy).control_k,
        split=scn.split,
        reservation_ttl_s=scn.ledger_ttl_s,
        replica_lease_s=scn.lease_s if scn.lease_s is not None else 10 * scn.ledger_ttl_s,
        **changes,
    )


def build_real(fleet: RealFleet, scn: BurstScenario) -> None:
    """Preload the real fleet's hosts as the model's (before ``setup``)."""
    for host_id, used in zip(fleet.host_ids, preload_plan(scn, fleet.stream("preload")), strict=True):
        if used is None:
            continue
        for _ in range(PRELOAD_SANDBOXES):
            fleet.preload(host_id, scn.sandbox_mb, used // PRELOAD_SANDBOXES, 1.0)


def burst_times(scn: BurstScenario, fleet: RealFleet, start: float) -> list[float]:
    return sorted(start + fleet.rng.uniform(0.0, scn.window_s) for _ in range(scn.creates))


def run_real(scn: BurstScenario, seed: int) -> BurstResult:
    """The burst through corral's own create flow (a policy that is a configuration of corral's)."""

    async def main() -> BurstResult:
        fleet = RealFleet(real_config(scn), seed)
        build_real(fleet, scn)
        await fleet.setup()
        hb_max = scn.heartbeat_s * (1 + scn.heartbeat_jitter)
        t0 = fleet.loop.time()
        start = t0 + hb_max + scn.view_ttl_s  # every host has heartbeated and every view cache is warm
        fleet.warm_views(t0 + hb_max, start)
        await asyncio.sleep(start - t0)
        free_before = fleet.admittable()
        spec = CreateSpec(memory_mb=scn.sandbox_mb, cpus=scn.sandbox_cpu)
        await asyncio.gather(
            *(fleet.create(spec, f"c{i}", at) for i, at in enumerate(burst_times(scn, fleet, start)))
        )
        await asyncio.sleep(2 * hb_max)  # heartbeats confirm what was placed
        t = fleet.tally
        refusals = t.refusals + fleet.agent_refusals()
        age, decisions = fleet.view_age()
        return BurstResult(
            scenario=scn,
            seed=seed,
            per_host={h: t.placements.get(h, 0) for h in fleet.host_ids},
            refusals={str(k): v for k, v in sorted(refusals.items())},
            placed=t.placed,
            mean_view_age_s=age / decisions if decisions else 0.0,
            free_mb_before=free_before,
            outstanding_mb_after=fleet.outstanding_mb(),
            refused_then_placed=len(t.waits_s),
            max_wait_s=max(t.waits_s, default=0.0),
        )

    result: BurstResult = run_seeded(main(), f"burst/{seed}")
    return result


def run(scn: BurstScenario, seed: int = 1, *, on_model: bool = False) -> BurstResult:
    """``on_model``: run even a configuration of corral's on the fleet model (to compare the two)."""
    if not (on_model or policy_named(scn.policy).is_model):
        return run_real(scn, seed)
    fleet = build(scn, seed)
    free_before = {h.id: h.admittable for h in fleet.hosts}
    hb_max = scn.heartbeat_s * (1 + scn.heartbeat_jitter)
    start = hb_max + scn.view_ttl_s  # every host has heartbeated and every view cache is warm
    fleet.warm_views(hb_max, start)
    req = CreateRequest(memory_mb=scn.sandbox_mb, cpu=scn.sandbox_cpu)
    fleet.burst(req, scn.creates, start, scn.window_s)
    fleet.run(start + scn.window_s + fleet.cfg.retry.deadline_s + 2 * hb_max + scn.view_ttl_s)
    m = fleet.metrics
    return BurstResult(
        scenario=scn,
        seed=seed,
        per_host=counts_for(fleet.hosts, m.placements),
        refusals={str(k): v for k, v in sorted(m.refusals.items())},
        placed=m.placed,
        mean_view_age_s=m.mean_view_age_s,
        free_mb_before=free_before,
        outstanding_mb_after=fleet.outstanding_mb(),
        refused_then_placed=len(m.waits_s),
        max_wait_s=max(m.waits_s, default=0.0),
    )
