"""``density``: how many idle sandboxes fit per host under committed vs working-set admission, and how
many OOM events each causes (committed admission stops a 32 GiB host at about seven 4 GiB sandboxes that
have touched a fraction of their memory).

The same offered load (a Poisson stream of long-lived creates, more than the fleet can hold) runs once
per admission mode; sandboxes touch about 300 MB of their 4 GiB, growing toward it over a few seconds.

The ``corral`` policy runs through corral's own create flow and real agents on the ``sim`` runtime,
whose kernel kills the largest sandbox's workload when a host's physical memory is exhausted (counted
in that sandbox's OOM kills, reported by its agent's heartbeat onto its record) and whose memory in
use feeds the agents' pressure gates. Models of other schedulers run on the fleet model, where an OOM
kill ends the sandbox.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field
from typing import Any

from corral.control.create import CreateSpec
from corral.core import AdmissionMode, CreateRequest, TouchModel
from corral.sim.baselines.fleet import ModelFleet, ModelFleetConfig
from corral.sim.baselines.policies import policy as policy_named
from corral.sim.experiments.engines import real_fleet_config
from corral.sim.flow.harness import run_seeded
from corral.sim.flow.real_fleet import RealFleet
from corral.sim.scenario import ClientBackoff, HostSpec


@dataclass(frozen=True, slots=True)
class DensityScenario:
    hosts: int = 4
    host_memory_mb: int = 32768
    host_cpus: float = 64.0
    sandbox_mb: int = 4096
    # CPU is not what this experiment measures; a small request keeps it from binding first.
    sandbox_cpu: float = 0.25
    working_set_mb: int = 300
    working_set_jitter: float = 0.2
    spike_probability: float = 0.0
    spike_mb: int = 1024
    spike_window_s: tuple[float, float] = (10.0, 60.0)
    spike_for_s: float = 20.0
    rate_per_s: float = 2.0
    duration_s: float = 600.0
    heartbeat_s: float = 10.0
    settle_s: float = 30.0
    memory_tick_s: float = 1.0
    pressure_close_at: float = 0.95
    pressure_open_at: float = 0.90
    policy: str = "corral"
    view_ttl_s: float = 1.0
    sample_s: float = 5.0
    # Offered load, not patience: a refused create is counted and not retried.
    retry_deadline_s: float = 0.0

    def __post_init__(self) -> None:
        policy_named(self.policy)
        if self.rate_per_s <= 0 or self.duration_s <= 0:
            raise ValueError("rate_per_s and duration_s must be positive")


@dataclass(frozen=True, slots=True)
class ModeResult:
    mode: str
    per_host: float
    oom_events: int
    refusals: dict[str, int]
    resident_to_committed: float
    # (time, sandboxes per host, physical memory used as a fraction of the fleet's)
    series: list[tuple[float, float, float]] = field(default_factory=list)
    # Through the create flow: the OOM kills the control plane learned of from heartbeats, by the end,
    # and the kills it must have learned of: those a heartbeat and a half or more before the end.
    oom_reported: int | None = None
    oom_reportable: int | None = None


@dataclass(frozen=True, slots=True)
class DensityResult:
    scenario: DensityScenario
    seed: int
    committed: ModeResult
    working_set: ModeResult

    def as_json(self) -> dict[str, Any]:
        return {
            "experiment": "density",
            "seed": self.seed,
            "engine": policy_named(self.scenario.policy).engine,
            "scenario": asdict(self.scenario),
            "committed_per_host": self.committed.per_host,
            "working_set_per_host": self.working_set.per_host,
            "density_ratio": round(self.working_set.per_host / self.committed.per_host, 2)
            if self.committed.per_host
            else None,
            "committed_oom_events": self.committed.oom_events,
            "working_set_oom_events": self.working_set.oom_events,
            "committed_refusals": self.committed.refusals,
            "working_set_refusals": self.working_set.refusals,
            "committed_resident_to_committed": self.committed.resident_to_committed,
            "working_set_resident_to_committed": self.working_set.resident_to_committed,
            "committed_oom_reported": self.committed.oom_reported,
            "working_set_oom_reported": self.working_set.oom_reported,
        }


def host_spec(scn: DensityScenario, mode: AdmissionMode) -> HostSpec:
    return HostSpec(
        memory_mb=scn.host_memory_mb,
        cpus=scn.host_cpus,
        heartbeat_s=scn.heartbeat_s,
        mode=mode,
        settle_s=scn.settle_s,
        memory_tick_s=scn.memory_tick_s,
        pressure=(scn.pressure_close_at, scn.pressure_open_at),
    )


def touch_model(scn: DensityScenario) -> TouchModel:
    return TouchModel(
        working_set_mb=scn.working_set_mb,
        working_set_jitter=scn.working_set_jitter,
        spike_probability=scn.spike_probability,
        spike_mb=scn.spike_mb,
        spike_window_s=scn.spike_window_s,
        spike_for_s=scn.spike_for_s,
    )


def run_real_mode(scn: DensityScenario, mode: AdmissionMode, seed: int) -> ModeResult:
    """Through corral's own create flow, agents and ``sim`` runtime (a policy that is corral's)."""
    cfg = real_fleet_config(
        policy_named(scn.policy),
        scn.hosts,
        host_spec(scn, mode),
        scn.view_ttl_s,
        touch=touch_model(scn),
        retry=ClientBackoff(deadline_s=scn.retry_deadline_s),
    )
    total_mb = scn.hosts * scn.host_memory_mb

    async def main() -> ModeResult:
        fleet = RealFleet(cfg, seed)
        await fleet.setup()
        t0 = fleet.loop.time()
        start = t0 + scn.heartbeat_s * 1.2
        end = start + scn.duration_s
        req = CreateSpec(memory_mb=scn.sandbox_mb, cpus=scn.sandbox_cpu)
        t, n = start, 0
        while True:
            t += fleet.rng.expovariate(scn.rate_per_s)
            if t >= end:
                break
            fleet.background(fleet.create(req, f"c{n}", t))
            n += 1
        series: list[tuple[float, float, float]] = []
        reportable_by = end - 1.5 * scn.heartbeat_s
        reportable = 0
        at = t0
        while at <= end + 1e-9:
            await asyncio.sleep(at - fleet.loop.time())
            now = fleet.loop.time()
            if now <= reportable_by:
                reportable = sum(st.oom_kills_total for st in fleet.states.values())
            used = sum(st.resident_mb_total(now) for st in fleet.states.values())
            series.append((round(now - t0, 3), sum(fleet.live_counts()) / scn.hosts, used / total_mb))
            at += scn.sample_s
        now = fleet.loop.time()
        live = [s for st in fleet.states.values() for s in st.sandboxes.values()]
        committed = sum(s.handle.spec.memory_mb for s in live)
        resident = sum(s.resident_mb(now) for s in live)
        refusals = fleet.tally.refusals + fleet.agent_refusals()
        return ModeResult(
            mode=str(mode),
            per_host=len(live) / scn.hosts,
            oom_events=sum(st.oom_kills_total for st in fleet.states.values()),
            refusals={str(k): v for k, v in sorted(refusals.items())},
            resident_to_committed=round(resident / committed, 4) if committed else 0.0,
            series=series,
            oom_reported=sum(sb.oom_kills for sb in fleet.store.sandboxes.values()),
            oom_reportable=reportable,
        )

    result: ModeResult = run_seeded(main(), f"density/{seed}/{mode}")
    return result


def run_mode(scn: DensityScenario, mode: AdmissionMode, seed: int, *, on_model: bool = False) -> ModeResult:
    """``on_model``: run even a configuration of corral's on the fleet model (to compare the two)."""
    if not (on_model or policy_named(scn.policy).is_model):
        return run_real_mode(scn, mode, seed)
    spec = host_spec(scn, mode)
    touch = touch_model(scn)
    fleet = ModelFleet(
        ModelFleetConfig(
            hosts=scn.hosts,
            policy=policy_named(scn.policy),
            host=spec,
            view_ttl_s=scn.view_ttl_s,
            touch=touch,
            retry=ClientBackoff(deadline_s=scn.retry_deadline_s),
        ),
        seed,
    )
    req = CreateRequest(memory_mb=scn.sandbox_mb, cpu=scn.sandbox_cpu)
    # Creates begin once every host has heartbeated; the same seed gives both modes the same stream.
    start = scn.heartbeat_s * 1.2
    fleet.poisson(req, scn.rate_per_s, start, start + scn.duration_s)
    series: list[tuple[float, float, float]] = []
    total_mb = scn.hosts * scn.host_memory_mb

    def sample(now: float) -> None:
        live = sum(len(h.sandboxes) for h in fleet.hosts)
        used = sum(h.physical_mb(now) for h in fleet.hosts)
        series.append((round(now, 3), live / scn.hosts, used / total_mb))

    end = start + scn.duration_s
    fleet.every(scn.sample_s, sample, 0.0, end)
    fleet.run(end)
    live = [s for h in fleet.hosts for s in h.sandboxes.values()]
    committed = sum(s.memory_mb for s in live)
    resident = sum(s.resident_mb(end) for s in live)
    return ModeResult(
        mode=str(mode),
        per_host=len(live) / scn.hosts,
        oom_events=fleet.oom_events(),
        refusals=dict(sorted(fleet.metrics.refusals.items())),
        resident_to_committed=round(resident / committed, 4) if committed else 0.0,
        series=series,
    )


def run(scn: DensityScenario, seed: int = 1, *, on_model: bool = False) -> DensityResult:
    return DensityResult(
        scenario=scn,
        seed=seed,
        committed=run_mode(scn, AdmissionMode.COMMITTED, seed, on_model=on_model),
        working_set=run_mode(scn, AdmissionMode.WORKING_SET, seed, on_model=on_model),
    )
