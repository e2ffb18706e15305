"""How a decision walks the fleet. Each selector filters and scores; they differ in which hosts they look
at and how they break ties:

- ``PowerOfK``: sample K hosts, filter only those, keep the best. O(K) per decision whatever the fleet
  size, with a bounded number of extra probes when samples are infeasible, and a full scan only on the
  path that is about to refuse (a refusal must be true of the whole fleet, not of a sample).
- ``FullScan``: every host, best score, ties broken by ``tie_rank`` under a random salt (K = all).
- ``Naive``: every host, the first best score wins. A deterministic argmax, kept as a baseline: over
  a frozen view it sends every decision to the same host.
- ``Jitter``: every host, scores perturbed by a small random factor, ties broken as ``FullScan`` does.
"""

from __future__ import annotations

import heapq
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from corral.core.filters import Filter, FilterContext, first_failure
from corral.core.fit import tie_rank
from corral.core.scoring import Scorer
from corral.core.types import CreateRequest, HostView


@dataclass(slots=True)
class Choice:
    host: HostView | None
    score: float = 0.0
    # reason -> hosts that failed on it, among the hosts this decision looked at
    reasons: dict[str, int] = field(default_factory=dict)
    checked: int = 0
    oldest_heartbeat_at: float | None = None
    # The feasible hosts this decision scored, best first (at most ``MAX_CANDIDATES``, or all of a
    # fleet of at most ``SMALL_FLEET``): what a commit step may still choose among with fresher
    # numbers than this decision had.
    candidates: tuple[HostView, ...] = ()
    # The score of each of ``candidates``, in the same order.
    scores: tuple[float, ...] = ()
    # (host id, the filter that rejected it) for the first ``MAX_REJECTED`` hosts that failed one: what
    # an explanation shows; ``reasons`` still counts every rejection.
    rejected: tuple[tuple[str, str], ...] = ()


MAX_CANDIDATES = 8
MAX_REJECTED = 16
# A fleet this small is scanned whole on every decision, and every feasible host goes to the commit
# step, which then chooses by the store's current totals among all of them: a sample of a few out of a
# dozen hosts sometimes holds only busy ones, and looking at every one costs little here.
SMALL_FLEET = 16


class Selector(ABC):
    name: str = ""

    @abstractmethod
    def select(
        self,
        hosts: Sequence[HostView],
        req: CreateRequest,
        ctx: FilterContext,
        filters: Sequence[Filter],
        scorer: Scorer,
        rng: random.Random,
    ) -> Choice: ...


def _scan(
    hosts: Iterable[HostView],
    req: CreateRequest,
    ctx: FilterContext,
    filters: Sequence[Filter],
    enough: int | None = None,
) -> tuple[list[HostView], dict[str, int], list[tuple[str, str]]]:
    """Filter ``hosts`` in turn, until ``enough`` of them are feasible (None: every one): the feasible
    ones, and how many failed on each filter, with the first ``MAX_REJECTED`` of those named."""
    feasible: list[HostView] = []
    reasons: dict[str, int] = {}
    rejected: list[tuple[str, str]] = []
    for h in hosts:
        r = first_failure(h, req, ctx, filters)
        if r is None:
            feasible.append(h)
            if len(feasible) == enough:
                break  # before the next host is asked for: a random sample draws no more than it uses
        else:
            reasons[r] = reasons.get(r, 0) + 1
            if len(rejected) < MAX_REJECTED:
                rejected.append((h.id, r))
    return feasible, reasons, rejected


def _best(
    candidates: Sequence[HostView],
    req: CreateRequest,
    ctx: FilterContext,
    scorer: Scorer,
    rng: random.Random | None,
    jitter: float = 0.0,
) -> Choice:
    """Highest score; ties broken by ``tie_rank`` under a salt drawn from ``rng`` (the store's rule,
    so each tied host wins equally often), else the first wins. The choice keeps the best
    ``MAX_CANDIDATES`` of them, or all of them when they are as few as a small fleet."""
    keep = len(candidates) if len(candidates) <= SMALL_FLEET else MAX_CANDIDATES
    best: HostView | None = None
    best_score = float("-inf")
    oldest: float | None = None
    salt: str | None = None
    scored: list[tuple[float, int, HostView]] = []
    for i, h in enumerate(candidates):
        s = scorer.score(h, ctx.pending(h.id), req)
        if jitter and rng is not None:
            s *= 1.0 + rng.uniform(-jitter, jitter)
        scored.append((s, -i, h))
        if oldest is None or h.heartbeat_at < oldest:
            oldest = h.heartbeat_at
        if s > best_score:
            best, best_score = h, s
        elif s == best_score and rng is not None and best is not None:
            if salt is None:  # drawn only when a tie needs it, so a decision without one draws nothing
                salt = tie_salt(rng)
            if tie_rank(salt, h.id) < tie_rank(salt, best.id):
                best = h
    if len(scored) <= 2:
        top = sorted(scored, key=lambda t: (t[0], t[1]), reverse=True)
    else:
        top = heapq.nlargest(keep, scored, key=lambda t: (t[0], t[1]))
    if best is not None and (not top or top[0][2] is not best):
        # a random tiebreak may have chosen a host the top list cut: the chosen one always leads
        top = [(best_score, 0, best), *(t for t in top if t[2] is not best)][:keep]
    return Choice(
        best,
        best_score,
        oldest_heartbeat_at=oldest,
        candidates=tuple(t[2] for t in top),
        scores=tuple(t[0] for t in top),
    )


def tie_salt(rng: random.Random) -> str:
    """A fresh per-decision salt for ``tie_rank``."""
    return f"{rng.getrandbits(64):016x}"


def _choice(best: Choice, reasons: dict[str, int], checked: int, rejected: list[tuple[str, str]]) -> Choice:
    best.reasons = reasons
    best.checked = checked
    best.rejected = tuple(rejected)
    return best


@dataclass(frozen=True, slots=True)
class PowerOfK(Selector):
    k: int = 2
    # Probes spent looking for K feasible hosts before falling back to a full scan.
    max_probes: int = 32
    name: str = "power_of_k"

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError("k must be >= 1")

    def select(
        self,
        hosts: Sequence[HostView],
        req: CreateRequest,
        ctx: FilterContext,
        filters: Sequence[Filter],
        scorer: Scorer,
        rng: random.Random,
    ) -> Choice:
        n = len(hosts)
        if self.k >= n:
            return FullScan().select(hosts, req, ctx, filters, scorer, rng)
        seen: set[int] = set()
        sample = _draws(hosts, rng, max(self.max_probes, 2 * self.k), seen)
        feasible, reasons, rejected = _scan(sample, req, ctx, filters, enough=self.k)
        checked = len(seen)
        if not feasible:
            # Most of the fleet is infeasible: look at all of it, then still choose among K at random.
            feasible, reasons, rejected = _scan(hosts, req, ctx, filters)
            checked = n
            if len(feasible) > self.k:
                feasible = rng.sample(feasible, self.k)
        return _choice(_best(feasible, req, ctx, scorer, rng), reasons, checked, rejected)


def _draws(hosts: Sequence[HostView], rng: random.Random, probes: int, seen: set[int]) -> Iterator[HostView]:
    """Hosts drawn at random, each at most once, in at most ``probes`` draws (a draw of a host already
    drawn is spent all the same); ``seen`` gathers the indexes of those drawn."""
    n = len(hosts)
    draw = rng.random
    for _ in range(probes):
        i = int(draw() * n)
        if i not in seen:
            seen.add(i)
            yield hosts[i]


@dataclass(frozen=True, slots=True)
class FullScan(Selector):
    """Every host filtered, the best scored chosen; its variants differ only in how ties and near-ties
    fall (``random_ties``, ``amplitude``)."""

    name: str = "full_scan"
    # Ties broken at random (False: the first of the best in the fleet's order wins).
    random_ties: bool = True
    # Multiplicative noise on each score (0: none).
    amplitude: float = 0.0

    def select(
        self,
        hosts: Sequence[HostView],
        req: CreateRequest,
        ctx: FilterContext,
        filters: Sequence[Filter],
        scorer: Scorer,
        rng: random.Random,
    ) -> Choice:
        feasible, reasons, rejected = _scan(hosts, req, ctx, filters)
        best = _best(feasible, req, ctx, scorer, rng if self.random_ties else None, self.amplitude)
        return _choice(best, reasons, len(hosts), rejected)


@dataclass(frozen=True, slots=True)
class Naive(FullScan):
    """The first of the best wins: every replica with the same view picks the same host."""

    name: str = "naive"
    random_ties: bool = False


@dataclass(frozen=True, slots=True)
class Jitter(FullScan):
    # Small enough to keep the policy, so it rarely breaks a real gap between hosts (free memory
    # differs by hundreds of MB, so scores rarely tie): a weak fix on its own, reproduced rather than
    # hidden.
    name: str = "jitter"
    amplitude: float = 0.02


def candidate_limit(n: int) -> int:
    """Every host of a fleet of at most ``SMALL_FLEET``; beyond, Nomad's candidate limit,
    max(2, ceil(log2 n)): O(log n) for a large fleet."""
    return n if n <= SMALL_FLEET else max(2, math.ceil(math.log2(n)))
