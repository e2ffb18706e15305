"""One placement decision, the shape of the Kubernetes scheduling framework: filter, score, select,
then reserve. ``Placer`` is pure: it reads a frozen view and a pending function and names a host or a
refusal. ``Scheduler`` adds the reserve step against a ledger; it is what a replica (or a simulated
one) runs, unchanged, in production and in a test harness."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from corral.core.admission import DEFAULT_POLICY, AdmissionPolicy, request_charge_mb
from corral.core.filters import DEFAULT_FILTERS, Filter, FilterContext, PendingFn, Reason, no_pending
from corral.core.ledger import Ledger, Reservation
from corral.core.refusals import NoCapacity, NoHealthyHosts
from corral.core.scoring import Scorer
from corral.core.selection import PowerOfK, Selector
from corral.core.types import CreateRequest, HostView, Pending


@dataclass(frozen=True, slots=True)
class Decision:
    host: HostView
    score: float
    reasons: dict[str, int]
    checked: int
    # How old the oldest heartbeat this decision leaned on was: staleness, made visible.
    view_age_s: float
    charge_mb: int
    # Feasible hosts this decision scored, best first (``host`` is the first).
    candidates: tuple[HostView, ...] = ()
    # The score of each candidate, and the hosts filters rejected (host id, filter), bounded.
    scores: tuple[float, ...] = ()
    rejected: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Placer:
    selector: Selector = field(default_factory=PowerOfK)
    scorer: Scorer = field(default_factory=Scorer)
    filters: tuple[Filter, ...] = DEFAULT_FILTERS
    stale_after_s: float = 30.0
    policy: AdmissionPolicy = DEFAULT_POLICY
    roles: frozenset[str] = frozenset({"worker"})

    def place(
        self,
        hosts: Sequence[HostView],
        req: CreateRequest,
        *,
        now: float,
        rng: random.Random,
        pending: PendingFn = no_pending,
        exclude: frozenset[str] = frozenset(),
    ) -> Decision:
        ctx = FilterContext(now, self.stale_after_s, pending, exclude, self.policy, self.roles)
        choice = self.selector.select(hosts, req, ctx, self.filters, self.scorer, rng)
        if choice.host is None:
            if not hosts or choice.reasons.get(Reason.STALE, 0) == choice.checked:
                raise NoHealthyHosts(choice.reasons, choice.checked, rejected=choice.rejected)
            raise NoCapacity(choice.reasons, choice.checked, rejected=choice.rejected)
        oldest = choice.oldest_heartbeat_at if choice.oldest_heartbeat_at is not None else now
        return Decision(
            choice.host,
            choice.score,
            choice.reasons,
            choice.checked,
            max(0.0, now - oldest),
            request_charge_mb(req, choice.host.memory_admission, self.policy),
            choice.candidates,
            choice.scores,
            choice.rejected,
        )


class Scheduler:
    """A decider with a ledger: place, then reserve at once so the next decision sees this one."""

    def __init__(
        self, placer: Placer, ledger: Ledger | None, rng: random.Random, owner: str = "local"
    ) -> None:
        self.placer = placer
        self.ledger = ledger
        self.rng = rng
        self.owner = owner

    def schedule(
        self,
        hosts: Sequence[HostView],
        req: CreateRequest,
        *,
        now: float,
        exclude: frozenset[str] = frozenset(),
        base_pending: PendingFn | None = None,
    ) -> tuple[Decision, Reservation | None]:
        """Place, then reserve. ``base_pending`` is what is pending outside this scheduler's ledger
        (another decider's claims, read from shared state); the ledger's claims are added to it."""
        ledger = self.ledger
        pending: PendingFn
        if ledger is None:
            pending = base_pending or no_pending
        elif base_pending is None:
            pending = ledger.pending
        else:
            pending = _sum_pending(base_pending, ledger.pending)
        decision = self.placer.place(hosts, req, now=now, rng=self.rng, pending=pending, exclude=exclude)
        if ledger is None:
            return decision, None
        res = ledger.reserve(decision.host.id, decision.charge_mb, req.cpu, self.owner)
        return decision, res


def _sum_pending(a: PendingFn, b: PendingFn) -> PendingFn:
    def pending(host_id: str) -> Pending:
        x, y = a(host_id), b(host_id)
        return Pending(x.memory_mb + y.memory_mb, x.cpu + y.cpu)

    return pending
