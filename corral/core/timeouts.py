"""Timeouts that are separate on purpose, and the orderings between them that start-up enforces."""

from __future__ import annotations

from dataclasses import dataclass


class ConfigError(ValueError):
    """A configuration that breaks one of corral's orderings; refused at start-up."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    heartbeat_interval_s: float = 2.0
    stale_after_s: float = 10.0  # stop placing there: a scheduling hint
    dead_after_s: float = 60.0  # declare dead, start failover: irreversible
    bind_timeout_s: float = 30.0  # the slowest bind we wait for
    reservation_ttl_s: float = 120.0  # must outlive the slowest bind
    view_ttl_s: float = 1.0

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
        if not self.reservation_ttl_s > self.bind_timeout_s:
            raise ConfigError(
                f"reservation_ttl ({self.reservation_ttl_s}s) must outlive the slowest bind "
                f"({self.bind_timeout_s}s), or a slow bind's capacity is counted twice"
            )
