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
from collections.abc import Iterable
from dataclasses import dataclass

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
    return covers(admittable, pending_mb, request_charge_mb(request, mode, policy))


def covers(admittable: int, pending_mb: int, charge: int) -> bool:
    """The fit rule on a charge already computed: what the store's reservation checks, where two
    deciders cannot both pass it (the SQL stores state it as ``admittable - reserved >= charge``)."""
    return admittable - pending_mb >= charge


def cpu_fits(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> bool:
    return host.cpu_used + pending.cpu + request.cpu <= host.cpu_total * policy.cpu_overcommit


def memory_fits(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> bool:
    """The scheduler's view of the gate: the host's published verdict minus what is still pending."""
    return fits(host.memory_mb_admittable, pending.memory_mb, request, host.memory_admission, policy)


def host_fits(
    host: HostView, pending: Pending, request: CreateRequest, policy: AdmissionPolicy = DEFAULT_POLICY
) -> bool:
    """Memory and CPU both."""
    return memory_fits(host, pending, request, policy) and cpu_fits(host, pending, request, policy)


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
