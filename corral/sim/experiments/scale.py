"""``scale``: the fullest of n hosts after n creates, for random choice, power-of-2 and a full scan
(the balls-and-bins result: ln n / ln ln n for one random choice, ln ln n / ln 2 + O(1)
for the better of two).

Information is perfectly fresh here: one shared ledger holds every placement, so each decision sees all
earlier ones. This isolates the selectors; ``staleness`` is where information gets old.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from corral.core import CreateRequest, HostView, Ledger, ManualClock, Placer, Scheduler
from corral.sim.baselines.policies import policy as policy_named
from corral.sim.experiments.result import PointsResult

SCALE_POLICIES = ("random", "power_of_2", "full_scan")


@dataclass(frozen=True, slots=True)
class ScaleScenario:
    ns: tuple[int, ...] = (16, 64, 256, 1024, 4096, 16384, 65536)
    policies: tuple[str, ...] = SCALE_POLICIES
    trials: int = 3
    # A full scan costs O(n) per decision, O(n^2) per point: it stops here (its answer is 1 anyway).
    full_scan_max_n: int = 1024

    def __post_init__(self) -> None:
        for p in self.policies:
            policy_named(p)
        if self.trials < 1 or any(n < 2 for n in self.ns):
            raise ValueError("trials must be >= 1 and every n >= 2")


@dataclass(frozen=True, slots=True)
class ScalePoint:
    policy: str
    n: int
    max_load: float  # mean over trials of the fullest host's count
    theory: float | None


@dataclass(frozen=True, slots=True)
class ScaleResult(PointsResult[ScaleScenario, ScalePoint]):
    experiment: ClassVar[str] = "scale"


def theory(policy: str, n: int) -> float | None:
    if policy == "random":
        return math.log(n) / math.log(math.log(n)) if n > 2 else None
    if policy == "power_of_2":
        return math.log(math.log(n)) / math.log(2) if n > 2 else None
    if policy == "full_scan":
        return 1.0
    return None


def max_load(policy: str, n: int, seed: int) -> int:
    """Place n creates on n identical hosts with the core scheduler; the fullest host's count."""
    clock = ManualClock()
    hosts = tuple(
        HostView(
            id=f"h{i}",
            heartbeat_at=0.0,
            cpu_total=1024.0,
            cpu_used=0.0,
            memory_mb_total=1 << 30,
            memory_mb_used=0,
            memory_mb_admittable=(1 << 30) - 2048,
        )
        for i in range(n)
    )
    ledger = Ledger(clock, ttl_s=1e12)
    placer = Placer(selector=policy_named(policy).selector(), stale_after_s=1e12)
    sched = Scheduler(placer, ledger, random.Random(f"{seed}/scale/{policy}/{n}"))
    req = CreateRequest(memory_mb=1024)
    counts: Counter[str] = Counter()
    for _ in range(n):
        decision, _res = sched.schedule(hosts, req, now=0.0)
        counts[decision.host.id] += 1
    return max(counts.values())


def run(scn: ScaleScenario, seed: int = 1) -> ScaleResult:
    points: list[ScalePoint] = []
    for policy in scn.policies:
        for n in scn.ns:
            if policy == "full_scan" and n > scn.full_scan_max_n:
                continue
            loads = [max_load(policy, n, seed * 1000 + t) for t in range(scn.trials)]
            points.append(ScalePoint(policy, n, round(statistics.fmean(loads), 3), theory(policy, n)))
    return ScaleResult(scn, seed, points)
