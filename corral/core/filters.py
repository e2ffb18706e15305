"""Hard rules a host must pass, cheapest first. Each is a small named step; its name is the reason a
refusal reports (the Kubernetes Filter extension point, Nomad's feasibility checkers)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from corral.codes import ErrorCode
from corral.core.admission import DEFAULT_POLICY, AdmissionPolicy, cpu_fits, memory_fits
from corral.core.fit import TAKES_STATE
from corral.core.types import NO_PENDING, CreateRequest, HostView, Pending

PendingFn = Callable[[str], Pending]


def no_pending(host_id: str) -> Pending:
    return NO_PENDING


class Reason:
    STALE = "stale_heartbeat"
    DRAINING = "draining"
    ROLE = "role_disallowed"
    EXCLUDED = "excluded"
    TEMPLATE = ErrorCode.TEMPLATE_MISSING  # the word the host agent refuses with, for the same fact
    RUNTIME = "runtime_mismatch"
    GPU = "gpu_mismatch"
    FIT = "does_not_fit"
    CPU = "cpu_exhausted"


@dataclass(frozen=True, slots=True)
class FilterContext:
    """What one decision's filters may consult besides the host and the request."""

    now: float
    stale_after_s: float
    pending: PendingFn = no_pending
    exclude: frozenset[str] = frozenset()
    policy: AdmissionPolicy = DEFAULT_POLICY
    roles: frozenset[str] = frozenset({"worker"})


class Filter(ABC):
    """A named hard rule. ``passes`` is pure."""

    reason: str = ""

    @abstractmethod
    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool: ...


class FreshHeartbeat(Filter):
    # A host that stopped reporting looks idle to a free-capacity scorer: drop it before scoring.
    reason = Reason.STALE

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return ctx.now - host.heartbeat_at <= ctx.stale_after_s


class NotDraining(Filter):
    reason = Reason.DRAINING

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return host.state is TAKES_STATE


class RoleAllowed(Filter):
    reason = Reason.ROLE

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return host.role in ctx.roles


class NotExcluded(Filter):
    # A host that just refused this very create (starts saturated, pressure) is skipped, not killed.
    reason = Reason.EXCLUDED

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return host.id not in ctx.exclude


class HasTemplate(Filter):
    reason = Reason.TEMPLATE

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return req.template is None or host.templates is None or req.template in host.templates


class RuntimeMatches(Filter):
    reason = Reason.RUNTIME

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return req.runtime is None or req.runtime == host.runtime


class GpuMatches(Filter):
    reason = Reason.GPU

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return req.gpu is None or req.gpu == host.gpu


class Fits(Filter):
    # Memory, the resource that kills: the admission arithmetic minus what is pending.
    reason = Reason.FIT

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return memory_fits(host, ctx.pending(host.id), req, ctx.policy)


class CpuFits(Filter):
    # CPU degrades rather than kills, so it is overcommitted by a factor; a refusal still says which.
    reason = Reason.CPU

    def passes(self, host: HostView, req: CreateRequest, ctx: FilterContext) -> bool:
        return cpu_fits(host, ctx.pending(host.id), req, ctx.policy)


DEFAULT_FILTERS: tuple[Filter, ...] = (
    FreshHeartbeat(),
    NotDraining(),
    RoleAllowed(),
    NotExcluded(),
    HasTemplate(),
    RuntimeMatches(),
    GpuMatches(),
    Fits(),
    CpuFits(),
)


def first_failure(
    host: HostView, req: CreateRequest, ctx: FilterContext, filters: Sequence[Filter] = DEFAULT_FILTERS
) -> str | None:
    """The reason of the first filter ``host`` fails, or None if it passes them all."""
    for f in filters:
        if not f.passes(host, req, ctx):
            return f.reason
    return None
