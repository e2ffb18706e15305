"""Timeouts that are separate on purpose, and the orderings between them that start-up enforces."""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration that breaks one of corral's orderings; refused at start-up."""


# How often an agent looks at its run lease, and the longest it then takes to freeze what runs under
# it (a cgroup freeze per sandbox): a lapsed lease has frozen everything within this long.
FENCE_CHECK_S = 0.1
FENCE_BOUND_S = 0.25


@dataclass(frozen=True, slots=True)
class Timeouts:
    heartbeat_interval_s: float = 2.0
    stale_after_s: float = 10.0  # stop placing there: a scheduling hint
    dead_after_s: float = 60.0  # declare dead, start failover: irreversible
    bind_timeout_s: float = 30.0  # the slowest bind we wait for
    reservation_ttl_s: float = 120.0  # must outlive the slowest bind
    view_ttl_s: float = 1.0
    # How far two replicas' clocks may disagree (NTP keeps machines within milliseconds; this is the
    # bound the fence below is proved against, not a measurement).
    max_clock_skew_s: float = 0.5
    # How long a host may run its recreate-policy sandboxes after the heartbeat that last reached the
    # control plane (None: ``stale_after``, shortened if need be to keep the ordering below).
    run_lease_s: float | None = None

    @property
    def run_lease(self) -> float:
        """The run lease each heartbeat reply grants, counted by the agent from when it sent that
        heartbeat. It ends, and the host has frozen its recreate-policy sandboxes, before any replica
        can declare the host dead and start them elsewhere:
        ``run_lease + FENCE_BOUND_S + max_clock_skew <= dead_after``."""
        if self.run_lease_s is not None:
            return self.run_lease_s
        return min(self.stale_after_s, self.dead_after_s - self.max_clock_skew_s - FENCE_BOUND_S)

    def __post_init__(self) -> None:
        if (
            min(
                self.heartbeat_interval_s,
                self.stale_after_s,
                self.dead_after_s,
                self.bind_timeout_s,
                self.reservation_ttl_s,
            )
            <= 0
            or self.view_ttl_s < 0
        ):
            raise ConfigError("every timeout must be positive")
        if not self.heartbeat_interval_s < self.stale_after_s < self.dead_after_s:
            raise ConfigError(
                "need heartbeat_interval < stale_after < dead_after "
                f"(got {self.heartbeat_interval_s} / {self.stale_after_s} / {self.dead_after_s})"
            )
        if not 0 <= self.max_clock_skew_s < float("inf"):
            raise ConfigError("max_clock_skew must be a finite number, not negative")
        lease = self.run_lease
        if not lease > self.heartbeat_interval_s:
            raise ConfigError(
                f"the run lease ({lease:g}s) must outlast the heartbeat interval ({self.heartbeat_interval_s:g}s), "
                "or a healthy host freezes its sandboxes between heartbeats"
            )
        if lease + FENCE_BOUND_S + self.max_clock_skew_s > self.dead_after_s:
            raise ConfigError(
                f"need run_lease + {FENCE_BOUND_S}s (to freeze) + max_clock_skew <= dead_after "
                f"(got {lease:g} + {FENCE_BOUND_S} + {self.max_clock_skew_s:g} > {self.dead_after_s:g}): "
                "a host cut off could still run its recreate-policy sandboxes when they start elsewhere"
            )
        if not self.reservation_ttl_s > self.bind_timeout_s:
            raise ConfigError(
                f"reservation_ttl ({self.reservation_ttl_s}s) must outlive the slowest bind "
                f"({self.bind_timeout_s}s), or a slow bind's capacity is counted twice"
            )
