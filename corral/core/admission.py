"""Admission arithmetic: the one rule that the agent publishes, its gate enforces, the scheduler checks
and the simulator runs, so none of them can disagree about whether a sandbox fits.

- committed: configured memory of live sandboxes + pending + request <= total - headroom.
- working-set: resident memory of live sandboxes + reserve of unmeasured ones + pending + reserve(request)
  <= total - headroom, where reserve(r) = max(floor, frac * r).
- stateful sandboxes are charged their full configured memory in either mode.

The rule is split into ``admittable_mb`` (what the host can still take, before pending reservations; the
number an agent publishes) and ``fits`` (does one request fit, given that number and what is pending).
Both sides call the same two functions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass

from corral.core.fit import CPU, FIT_RULE, MEMORY, Bound, Term
from corral.core.types import AdmissionMode, CreateRequest, HostView, Pending, SandboxUsage


@dataclass(frozen=True, slots=True)
class AdmissionPolicy:
    headroom_mb: int = 2048
    reserve_floor_mb: int = 512
    reserve_frac: float = 0.25
    # CPU degrades rather than kills, so it may be overcommitted by this factor.
    cpu_overcommit: float = 4.0

    def __post_init__(self) -> None:
        if self.headroom_mb < 0 or self.reserve_floor_mb < 0:
            raise ValueError("headroom_mb and reserve_floor_mb must not be negative")
        if not 0.0 < self.reserve_frac <= 1.0:
            raise ValueError("reserve_frac must be in (0, 1]")
        if self.cpu_overcommit < 1.0:
            raise ValueError("cpu_overcommit must be >= 1")


DEFAULT_POLICY = AdmissionPolicy()


def reserve_mb(memory_mb: int, policy: AdmissionPolicy = DEFAULT_POLICY) -> int:
    """The feed-forward charge for a sandbox nobody has measured yet, never more than it asked for."""
    return min(memory_mb, max(policy.reserve_floor_mb, math.ceil(policy.reserve_frac * memory_mb)))


def charge_mb(
    memory_mb: int,
    stateful: bool,
    mode: AdmissionMode,
    resident_mb: int | None = None,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> int:
    """Memory one sandbox is charged on a host in ``mode``.

    A new request has ``resident_mb=None`` and is charged its reserve under working-set admission;
    a measured sandbox is charged what it actually holds.
    """
    if stateful or mode is AdmissionMode.COMMITTED:
        return memory_mb
    if resident_mb is None:
        return reserve_mb(memory_mb, policy)
    return resident_mb


def request_charge_mb(
    request: CreateRequest, mode: AdmissionMode, policy: AdmissionPolicy = DEFAULT_POLICY
) -> int:
    return charge_mb(request.memory_mb, request.stateful, mode, None, policy)


def admittable_mb(
    memory_mb_total: int,
    sandboxes: Iterable[SandboxUsage],
    mode: AdmissionMode,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> int:
    """Memory a host can still admit, before pending reservations. May be negative (over-admitted)."""
    charged = sum(charge_mb(s.memory_mb, s.stateful, mode, s.resident_mb, policy) for s in sandboxes)
    return memory_mb_total - policy.headroom_mb - charged


def fits(
    admittable: int,
    pending_mb: int,
    request: CreateRequest,
    mode: AdmissionMode,
    policy: AdmissionPolicy = DEFAULT_POLICY,
) -> bool:
    """The gate: does ``request`` fit into ``admittable`` once ``pending_mb`` is set aside?"""
    values = {
        Term.ADMITTABLE_MB: admittable,
        Term.PENDING_MB: pending_mb,
        Term.CHARGE_MB: request_charge_mb(request, mode, policy),
    }
    return MEMORY.holds(values, policy.cpu_overcommit)


def fit_terms(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> dict[Term, float]:
    """Every term of ``FIT_RULE`` for ``request`` on ``host`` with ``pending`` set aside."""
    return {
        Term.ADMITTABLE_MB: host.memory_mb_admittable,
        Term.MEMORY_TOTAL_MB: host.memory_mb_total,
        Term.PENDING_MB: pending.memory_mb,
        Term.CHARGE_MB: request_charge_mb(request, host.memory_admission, policy),
        Term.CPU_TOTAL: host.cpu_total,
        Term.CPU_USED: host.cpu_used,
        Term.PENDING_CPU: pending.cpu,
        Term.REQUEST_CPU: request.cpu,
    }


# Each term as Python over one host, its pending claims and the request (``charge`` is the request's
# charge on that host): the core's rendering of the rule, beside the store's SQL one.
_PY_TERMS = {
    Term.ADMITTABLE_MB: "host.memory_mb_admittable",
    Term.MEMORY_TOTAL_MB: "host.memory_mb_total",
    Term.PENDING_MB: "pending.memory_mb",
    Term.CHARGE_MB: "charge",
    Term.CPU_TOTAL: "host.cpu_total",
    Term.CPU_USED: "host.cpu_used",
    Term.PENDING_CPU: "pending.cpu",
    Term.REQUEST_CPU: "request.cpu",
}
BoundFn = Callable[[HostView, Pending, CreateRequest, AdmissionPolicy], float]


def _render(name: str, expr: str, reads: Iterable[Term]) -> BoundFn:
    """``expr`` (a bound's test, or terms of the score) compiled to a plain function of (host, pending,
    request, policy). The filters and the score run per host per decision: compiled once, a bound
    costs what the hand-written comparison did, not a dict of terms and a loop over them."""
    charge = (
        "    charge = request_charge_mb(request, host.memory_admission, policy)\n"
        if Term.CHARGE_MB in reads
        else ""
    )
    src = f"def f(host, pending, request, policy):\n{charge}    return {expr}\n"
    scope: dict[str, object] = {"request_charge_mb": request_charge_mb}
    exec(compile(src, f"<fit rule: {name}>", "exec"), scope)
    fn: BoundFn = scope["f"]  # type: ignore[assignment]
    return fn


def _holds_expr(bound: Bound) -> str:
    need = " + ".join(_PY_TERMS[t] for t in bound.need)
    room = _PY_TERMS[bound.room]
    return f"{need} <= {room} * policy.cpu_overcommit" if bound.overcommitted else f"{need} <= {room}"


def _left_expr(bound: Bound) -> str:
    return " - ".join([_PY_TERMS[bound.room], *(_PY_TERMS[t] for t in bound.need)])


def render_headroom(weighted: Sequence[tuple[Bound, float]]) -> BoundFn:
    """The weighted sum of what each bound leaves over its total (the spread score's headroom), as one
    compiled function: the request's charge worked out once, the terms added in the order a loop over
    ``weighted`` adds them (the same float result)."""
    parts = [
        f"{weight!r} * (({_left_expr(bound)}) / (({_PY_TERMS[bound.total]}) or 1))"
        for bound, weight in weighted
    ]
    reads = {t for bound, _ in weighted for t in (*bound.need, bound.room, bound.total)}
    return _render("headroom", " + ".join(["0.0", *parts]), reads)


HOLDS: dict[str, BoundFn] = {b.name: _render(b.name, _holds_expr(b), (*b.need, b.room)) for b in FIT_RULE}
_MEMORY_HOLDS, _CPU_HOLDS = HOLDS[MEMORY.name], HOLDS[CPU.name]


def cpu_fits(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> bool:
    return bool(_CPU_HOLDS(host, pending, request, policy))


def memory_fits(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> bool:
    """The scheduler's view of the gate: the host's published verdict minus what is still pending."""
    return bool(_MEMORY_HOLDS(host, pending, request, policy))


def host_fits(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> bool:
    """Memory and CPU both: every bound of ``FIT_RULE`` (what the store's reservations check too)."""
    return all(HOLDS[b.name](host, pending, request, policy) for b in FIT_RULE)


@dataclass(frozen=True, slots=True)
class Oversize:
    """A request no host could take even if it ran nothing: the field, and the most any host has."""

    field: str  # "cpus" or "memory_mb"
    largest: float


def oversize(hosts: Iterable[HostView], request: CreateRequest, roles: Collection[str]) -> Oversize | None:
    """Whether ``request`` asks for more than the largest host of ``roles`` has at all: more CPUs than
    its ``cpu_total`` (overcommit shares a host's CPUs among sandboxes; it does not make one sandbox's
    share larger than the host) or more memory than its ``memory_mb_total``. Such a request can never
    be placed, however long it waits. Hosts whose heartbeat carried no size say nothing; with none
    that did, None: nothing is known to be too small (the create goes on to the usual refusal)."""
    cpus = 0.0
    memory_mb = 0
    for h in hosts:
        if h.role in roles and h.cpu_total > 0 and h.memory_mb_total > 0:
            cpus = max(cpus, h.cpu_total)
            memory_mb = max(memory_mb, h.memory_mb_total)
    if cpus == 0.0:
        return None
    if request.cpu > cpus:
        return Oversize("cpus", cpus)
    if request.memory_mb > memory_mb:
        return Oversize("memory_mb", memory_mb)
    return None


class AdmissionBook:
    """``admittable_mb`` kept incrementally for a host with many sandboxes: the same rule (each
    sandbox charged ``charge_mb``), summed as sandboxes arrive, leave and get measured, so a gate that
    runs at every start costs O(1) instead of O(sandboxes). ``admittable()`` always equals
    ``admittable_mb(total, usages, mode, policy)`` over the usages it holds."""

    __slots__ = ("_charged", "_charges", "memory_mb_total", "mode", "policy")

    def __init__(
        self, memory_mb_total: int, mode: AdmissionMode, policy: AdmissionPolicy = DEFAULT_POLICY
    ) -> None:
        self.memory_mb_total = memory_mb_total
        self.mode = mode
        self.policy = policy
        self._charges: dict[str, int] = {}
        self._charged = 0

    def put(self, key: str, usage: SandboxUsage) -> None:
        """Account for a sandbox, or re-account for it after a measurement."""
        charge = charge_mb(usage.memory_mb, usage.stateful, self.mode, usage.resident_mb, self.policy)
        self._charged += charge - self._charges.get(key, 0)
        self._charges[key] = charge

    def remove(self, key: str) -> None:
        self._charged -= self._charges.pop(key, 0)

    def charged_mb(self) -> int:
        return self._charged

    def admittable(self) -> int:
        return self.memory_mb_total - self.policy.headroom_mb - self._charged

    def __len__(self) -> int:
        return len(self._charges)

    def __contains__(self, key: object) -> bool:
        return key in self._charges
