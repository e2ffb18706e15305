"""A host's run lease: its permission to run the sandboxes that fail over by being recreated elsewhere.

Each heartbeat reply renews it for ``lease_s``, counted from when the host *sent* that heartbeat (on
its own monotonic clock, so no clock of another machine is trusted): the control plane received the
heartbeat after that instant and declares the host dead only ``dead_after`` after receiving it, so
the host's lease ends first, by the margin :class:`~corral.core.timeouts.Timeouts` checks at start-up.
Lapsed, the host freezes those sandboxes; at ``dead_after_s`` from the same instant, it stops them
(they run elsewhere by then). A reply after a lapse renews it again: the host thaws what the reply
did not tell it to stop. Pure: ``now`` is an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum


class LeaseState(StrEnum):
    HELD = "held"
    LAPSED = "lapsed"  # freeze: a copy elsewhere may be about to start
    EXPIRED = "expired"  # stop: the host has been declared dead, its copies run elsewhere


@dataclass(slots=True)
class RunLease:
    # Never renewed: lapsed. A host that restarts keeps what it adopts frozen until a reply comes.
    renewed_at: float = -math.inf
    held_until: float = -math.inf
    dead_at: float = math.inf

    def renew(self, sent_at: float, lease_s: float, dead_after_s: float | None) -> None:
        """A reply to the heartbeat sent at ``sent_at`` granted ``lease_s``. A late reply to an older
        heartbeat than the one that last renewed it changes nothing."""
        if not (math.isfinite(lease_s) and lease_s > 0) or sent_at < self.renewed_at:
            return
        self.renewed_at = sent_at
        self.held_until = sent_at + lease_s
        dead = dead_after_s is not None and math.isfinite(dead_after_s) and dead_after_s > lease_s
        self.dead_at = sent_at + dead_after_s if dead and dead_after_s is not None else math.inf

    def state(self, now: float) -> LeaseState:
        if now < self.held_until:
            return LeaseState.HELD
        return LeaseState.EXPIRED if now >= self.dead_at else LeaseState.LAPSED
