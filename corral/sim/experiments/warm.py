"""``warm``: a burst of warm claims over a stale inventory. Hosts advertise how many warm sandboxes
they hold; the inventory is refreshed every ``refresh_s``, and the burst arrives inside one window.

- ``argmax``: each claim goes to the host advertising the most. Every claim of the window sees the same
  snapshot, so they all go to one host: it drains, and the rest of the burst is cold-started on it
  while its peers stay full (the drained-node signature).
- ``power_of_2``: the warmer of two sampled hosts, over the same stale snapshot. Spread, but a claim
  that lands on a drained host is a cold start there.
- ``corral``: corral's claim path, run as the server runs it: a pool (its intent and per-host targets)
  in the store model, real agents on the ``sim`` runtime filling their targets from their heartbeats'
  replies and advertising their ready counts in heartbeats, and each replica's create flow claiming
  by :func:`corral.core.warm.pick_warm` (power-of-2 over hosts advertising ready sandboxes in its
  cached view, minus the claims it made since their heartbeats); an empty host answers at once and the
  next one is asked (up to ``CLAIM_TRIES``), then the create goes cold through the placement flow. With
  several replicas, each knows only its own claims. The inventory is the replica's view: ``refresh_s``
  is its TTL. Agents stop refilling before the burst unless ``refill``, so every policy draws from the
  same inventory.

The first two are models of other schedulers, run over the inventory alone.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from corral.control.create import CreateSpec
from corral.core.warm import CLAIM_TRIES, pick_warm
from corral.sim.baselines.policies import policy as policy_named
from corral.sim.experiments.engines import real_fleet_config
from corral.sim.experiments.result import result_json
from corral.sim.flow.harness import run_seeded
from corral.sim.flow.real_fleet import RealFleet
from corral.sim.scenario import HostSpec
from corral.store import TemplateRecord

WARM_POLICIES = ("argmax", "power_of_2", "corral")


@dataclass(frozen=True, slots=True)
class WarmScenario:
    hosts: int = 12
    # Warm sandboxes per host at the start: drawn uniformly from this range (inclusive).
    warm_min: int = 8
    warm_max: int = 12
    claims: int = 100
    window_s: float = 1.0
    refresh_s: float = 10.0
    replicas: int = 1
    policies: tuple[str, ...] = WARM_POLICIES
    # The create flow's fleet: hosts, heartbeats, the pool's template, and whether agents refill
    # their pools while the burst draws on them.
    heartbeat_s: float = 10.0
    host_memory_mb: int = 32768
    sandbox_mb: int = 1024
    refill: bool = False

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.claims < 0 or self.replicas < 1:
            raise ValueError("hosts and replicas must be >= 1, claims >= 0")
        if not 0 <= self.warm_min <= self.warm_max:
            raise ValueError("need 0 <= warm_min <= warm_max")
        if self.window_s < 0 or self.refresh_s <= 0:
            raise ValueError("window_s must be >= 0 and refresh_s > 0")
        for p in self.policies:
            if p not in WARM_POLICIES:
                raise ValueError(f"unknown policy {p!r}: one of {', '.join(WARM_POLICIES)}")


@dataclass(frozen=True, slots=True)
class WarmOutcome:
    policy: str
    hits: int
    misses: int
    # Claims that landed per host (warm or cold), the cold starts per host, hosts left with no warm.
    per_host: dict[str, int]
    cold_per_host: dict[str, int]
    max_over_mean: float
    hosts_with_cold: int
    drained: int
    asked: int  # agent answers spent (a stale pick costs one)
    engine: str = "model"


@dataclass(frozen=True, slots=True)
class WarmResult:
    scenario: WarmScenario
    seed: int
    warm_at_start: dict[str, int]
    outcomes: list[WarmOutcome]

    def as_json(self) -> dict[str, Any]:
        return result_json(
            "warm",
            self.seed,
            self.scenario,
            warm_at_start=self.warm_at_start,
            outcomes=[asdict(o) for o in self.outcomes],
        )


def _one(s: WarmScenario, policy: str, start: dict[str, int], seed: int) -> WarmOutcome:
    rng = random.Random(f"{seed}/{policy}")
    ready = dict(start)
    snapshot = dict(start)
    next_refresh = s.refresh_s
    mine: list[Counter[str]] = [Counter() for _ in range(s.replicas)]  # claims since the snapshot
    landed: Counter[str] = Counter()
    cold: Counter[str] = Counter()
    hits = asked = 0
    for i in range(s.claims):
        t = i * s.window_s / max(1, s.claims)
        if t >= next_refresh:
            snapshot, next_refresh = dict(ready), next_refresh + s.refresh_s
            mine = [Counter() for _ in range(s.replicas)]
        replica = mine[i % s.replicas]
        if policy == "corral":
            candidates = [(h, n - replica[h]) for h, n in sorted(snapshot.items()) if n - replica[h] > 0]
            tries = CLAIM_TRIES
        else:  # one pick over the stale snapshot; a drained pick is a cold start there
            candidates = [(h, n) for h, n in sorted(snapshot.items()) if n > 0]
            tries = 1
        host: str | None = None
        for _ in range(tries):
            if not candidates:
                break
            if policy == "argmax":
                pick = max(candidates, key=lambda c: c[1])[0]
            else:
                pick = pick_warm(candidates, rng)[0]
            candidates = [c for c in candidates if c[0] != pick]
            asked += 1
            if ready[pick] > 0:
                ready[pick] -= 1
                replica[pick] += 1
                hits += 1
                host = pick
                break
            if policy != "corral":
                host = pick
                cold[pick] += 1
        if host is None:  # corral goes cold on the least-loaded host
            host = min(sorted(start), key=lambda x: (landed[x], x))
            cold[host] += 1
        landed[host] += 1
    return _outcome(s, policy, landed, cold, hits, sum(1 for n in ready.values() if n == 0), asked, "model")


TEMPLATE = "pooled"


def _outcome(
    s: WarmScenario,
    policy: str,
    landed: Counter[str],
    cold: Counter[str],
    hits: int,
    drained: int,
    asked: int,
    engine: str,
) -> WarmOutcome:
    return WarmOutcome(
        policy=policy,
        hits=hits,
        misses=s.claims - hits,
        per_host=dict(sorted(landed.items())),
        cold_per_host=dict(sorted(cold.items())),
        max_over_mean=round(max(landed.values()) / (s.claims / s.hosts), 3) if landed else 0.0,
        hosts_with_cold=len(cold),
        drained=drained,
        asked=asked,
        engine=engine,
    )


def run_real(s: WarmScenario, start: dict[str, int], seed: int) -> WarmOutcome:
    """corral's claim path through its own create flow, pools, agents and store model."""
    spec = HostSpec(memory_mb=s.host_memory_mb, heartbeat_s=s.heartbeat_s)
    cfg = real_fleet_config(policy_named("corral"), s.hosts, spec, s.refresh_s, replicas=s.replicas)

    async def main() -> WarmOutcome:
        fleet = RealFleet(cfg, seed)
        assert sorted(fleet.host_ids) == sorted(start)
        await fleet.setup()
        store = fleet.store
        await store.create_template(TemplateRecord(name=TEMPLATE, cpus=1.0, memory_mb=s.sandbox_mb))
        await store.create_pool(TEMPLATE, size=sum(start.values()))
        # The targets as they stand when the burst comes (the leader's spreading is not run: it
        # would level them).
        await store.set_pool_targets(TEMPLATE, start)
        keepers = [fleet.background(a.run_warm()) for a in fleet.agents.values()]
        t0 = fleet.loop.time()
        # Every host's first heartbeat brings its target and its second advertises the pool filled.
        filled = t0 + 2 * s.heartbeat_s
        begin = filled + s.refresh_s
        fleet.warm_views(filled, begin)
        await asyncio.sleep(filled - t0)
        if not s.refill:
            for k in keepers:
                k.cancel()
        await asyncio.sleep(begin - fleet.loop.time())
        create = CreateSpec(template=TEMPLATE)
        await asyncio.gather(
            *(
                fleet.create(create, f"c{i}", begin + i * s.window_s / max(1, s.claims))
                for i in range(s.claims)
            )
        )
        agents = fleet.agents.values()
        t = fleet.tally
        return _outcome(
            s,
            "corral",
            t.placements,
            t.placements - t.warm,
            sum(t.warm.values()),
            sum(1 for a in agents if a.warm.ready_count(TEMPLATE) == 0),
            sum(a.warm.stats.claims + a.warm.stats.empty for a in agents),
            "create_flow",
        )

    outcome: WarmOutcome = run_seeded(main(), f"warm/{seed}/{s.replicas}")
    return outcome


def host_ids(n: int) -> list[str]:
    """The fleet's host ids, as :class:`RealFleet` names them."""
    width = max(2, len(str(n - 1)))
    return [f"h{i:0{width}d}" for i in range(n)]


def run(s: WarmScenario, seed: int = 1, *, on_model: bool = False) -> WarmResult:
    """``on_model``: run corral's claim rule on the inventory model too (to compare the two)."""
    rng = random.Random(seed)
    start = {h: rng.randint(s.warm_min, s.warm_max) for h in host_ids(s.hosts)}
    outcomes = [
        run_real(s, start, seed) if p == "corral" and not on_model else _one(s, p, start, seed)
        for p in s.policies
    ]
    return WarmResult(s, seed, start, outcomes)
