"""What a simulated scenario is made of, whichever engine runs it (corral's real flows in
:mod:`corral.sim.flow`, or the models of other schedulers in :mod:`corral.sim.baselines`): the hosts'
hardware and agent configuration, the settled load a fleet starts with, the load balancer in front of
the replicas, and the clients' backoff. Both engines read the same scenario, so their results compare."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from corral.client.retry import RetryPolicy
from corral.core import DEFAULT_POLICY, AdmissionMode, AdmissionPolicy, TouchProfile

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class HostSpec:
    """One host's hardware and agent configuration."""

    memory_mb: int = 32768
    cpus: float = 16.0
    heartbeat_s: float = 10.0
    # Each interval is heartbeat_s * (1 +/- jitter), uniform: agents drift apart, as in a real fleet.
    heartbeat_jitter: float = 0.1
    mode: AdmissionMode = AdmissionMode.WORKING_SET
    # Enforce admission on the agent (the gate). Off: the agent starts whatever it is sent.
    gate: bool = True
    starts_limit: int | None = None
    # A sandbox is measured (charged its resident memory) only once it is this old: before that its
    # pages are still faulting in and a measurement would undercount it.
    settle_s: float = 30.0
    # Start latency: lognormal around a snapshot restore's (179 ms p50, ~203 ms p99).
    start_p50_s: float = 0.179
    start_sigma: float = 0.054
    # How often physical memory (and the pressure gate) is checked; None: at every heartbeat.
    memory_tick_s: float | None = None
    # (close_at, open_at) as a fraction of physical memory; None: no pressure gate.
    pressure: tuple[float, float] | None = None
    policy: AdmissionPolicy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        if self.memory_mb <= 0 or self.cpus <= 0 or self.heartbeat_s <= 0:
            raise ValueError("memory_mb, cpus and heartbeat_s must be positive")
        if not 0.0 <= self.heartbeat_jitter < 1.0:
            raise ValueError("heartbeat_jitter must be in [0, 1)")
        if self.starts_limit is not None and self.starts_limit < 1:
            raise ValueError("starts_limit must be >= 1")


def fixed_profile(limit_mb: int, resident_mb: int) -> TouchProfile:
    """A sandbox that has long since settled at ``resident_mb`` (a fleet's existing load)."""
    r = min(limit_mb, resident_mb)
    return TouchProfile(limit_mb=limit_mb, base_mb=r, working_set_mb=r, ramp_s=1.0)


# The client's half of an honest refusal is the SDK's own: full-jitter exponential backoff under a
# deadline.
ClientBackoff = RetryPolicy


def check_split(split: str) -> None:
    if split not in ("round_robin", "random"):
        raise ValueError("split must be 'round_robin' or 'random'")


class Router(Generic[T]):
    """The load balancer in front of the replicas: round-robin over the live ones, or uniform."""

    def __init__(self, split: str, rng: random.Random) -> None:
        self.split = split
        self.rng = rng
        self._rr = 0

    def pick(self, alive: Sequence[T]) -> T | None:
        if not alive:
            return None
        if self.split == "random":
            return alive[int(self.rng.random() * len(alive))]
        self._rr += 1
        return alive[(self._rr - 1) % len(alive)]
