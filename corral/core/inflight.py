"""Calls in flight per key (a sandbox, a tenant), at most ``limit`` each: the data plane's bounds.

A counter, not a queue: a call over the bound is refused at once (429 ``too_many_concurrent`` at the
edge), because waiting here would only hold one more connection and one more request on the server
that the bound exists to protect. The edges take a slot before the work and give it back after.
"""

from __future__ import annotations

from dataclasses import dataclass

# An agent UI runs a handful of commands at once in a sandbox; 16 leaves room for a burst of them.
DEFAULT_EXECS_PER_SANDBOX = 16
# Requests to one sandbox's ports a replica relays at once (WebSockets included).
DEFAULT_PORT_REQUESTS_PER_SANDBOX = 1024
# Per tenant, per API replica: several sandboxes' worth of that.
DEFAULT_EXECS_PER_TENANT = 64
# What a refused caller is told to wait: a slot frees when one of its own calls ends, and a command
# run through the data plane is typically over within a second or two.
BUSY_RETRY_S = 1.0


@dataclass(frozen=True, slots=True)
class Busy:
    """Why a slot was refused: what is bounded (``scope``), its limit, and what holds the slots."""

    scope: str
    limit: int
    in_flight: int

    @property
    def message(self) -> str:
        return f"{self.in_flight} calls in flight for this {self.scope} (limit {self.limit}); retry when one ends"

    def details(self) -> dict[str, object]:
        return {"scope": self.scope, "limit": self.limit, "in_flight": self.in_flight}


class InFlight:
    """At most ``limit`` slots held per key. A key holding none is forgotten, so the table is as large
    as the keys that have calls in flight."""

    def __init__(self, scope: str, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"the {scope} bound must be >= 1, got {limit}")
        self.scope = scope
        self.limit = limit
        self._held: dict[str, int] = {}
        self.refused_total = 0

    def enter(self, key: str) -> Busy | None:
        """Take a slot for ``key``; None when taken, else why not (nothing is taken then)."""
        held = self._held.get(key, 0)
        if held >= self.limit:
            self.refused_total += 1
            return Busy(self.scope, self.limit, held)
        self._held[key] = held + 1
        return None

    def leave(self, key: str) -> None:
        """Give back a slot ``enter`` gave."""
        held = self._held.get(key, 0)
        if held <= 0:
            raise RuntimeError(f"leave({key!r}) without a matching enter()")
        if held == 1:
            del self._held[key]
        else:
            self._held[key] = held - 1

    def in_flight(self, key: str) -> int:
        return self._held.get(key, 0)

    @property
    def total(self) -> int:
        """Slots held over every key."""
        return sum(self._held.values())
