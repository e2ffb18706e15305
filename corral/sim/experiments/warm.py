"""``warm``: a burst of warm claims over a stale inventory. Hosts advertise how many warm sandboxes
they hold; the inventory is refreshed every ``refresh_s``, and the burst arrives inside one window.

- ``argmax``: each claim goes to the host advertising the most. Every claim of the window sees the same
  snapshot, so they all go to one host: it drains, and the rest of the burst is cold-started on it
  while its peers stay full (the drained-node signature).
- ``power_of_2``: the warmer of two sampled hosts, over the same stale snapshot. Spread, but a claim
  that lands on a drained host is a cold start there.
- ``corral``: corral's claim path (:func:`corral.core.warm.pick_warm`): power-of-2 over the snapshot
  minus the claims this replica made since it, an empty host answers at once and the next one is
  asked (up to ``CLAIM_TRIES``), then a cold start placed on the least-loaded host. With several
  replicas, each knows only its own claims.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from corral.core.warm import CLAIM_TRIES, pick_warm

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


@dataclass(frozen=True, slots=True)
class WarmResult:
    scenario: WarmScenario
    seed: int
    warm_at_start: dict[str, int]
    outcomes: list[WarmOutcome]

    def as_json(self) -> dict[str, Any]:
        return {
            "experiment": "warm",
            "seed": self.seed,
            "scenario": asdict(self.scenario),
            "warm_at_start": self.warm_at_start,
            "outcomes": [asdict(o) for o in self.outcomes],
        }


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
    mean = s.claims / s.hosts
    return WarmOutcome(
        policy=policy,
        hits=hits,
        misses=s.claims - hits,
        per_host=dict(sorted(landed.items())),
        cold_per_host=dict(sorted(cold.items())),
        max_over_mean=round(max(landed.values()) / mean, 3) if landed else 0.0,
        hosts_with_cold=len(cold),
        drained=sum(1 for n in ready.values() if n == 0),
        asked=asked,
    )


def run(s: WarmScenario, seed: int = 1) -> WarmResult:
    rng = random.Random(seed)
    start = {f"h{i:02d}": rng.randint(s.warm_min, s.warm_max) for i in range(s.hosts)}
    return WarmResult(s, seed, start, [_one(s, p, start, seed) for p in s.policies])
