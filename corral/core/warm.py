"""Warm-pool policy, pure: how a pool's size is spread over hosts, and which host a claim asks.

Both are used by the control plane and by the simulator, so the simulator proves corral's own rule.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

H = TypeVar("H")


# Hosts a claim asks before it gives up on warm and goes cold: a stale pick costs one answer.
CLAIM_TRIES = 3


@dataclass(frozen=True, slots=True)
class Slot:
    """A host a pool may put warm sandboxes on, with the room it has for them."""

    host_id: str
    room_mb: int


def spread(
    size: int,
    max_per_host: int | None,
    slots: Sequence[Slot],
    current: Mapping[str, int],
    charge_mb: int,
    rng: random.Random,
    k: int = 2,
) -> dict[str, int]:
    """Split ``size`` warm sandboxes over ``slots``: what each already has stays where it is (no churn),
    within the cap and the room; more go one at a time to the emptier of ``k`` sampled hosts that
    still have room (power-of-K on headroom), then the fullest give one to the emptiest until they
    differ by at most one, so a host that joins takes its share. A host no longer in ``slots``
    (gone, stale, draining) loses its targets. The sum is ``size``, or less when the fleet has no room.
    """
    cap = max_per_host if max_per_host is not None else size
    room = {s.host_id: s.room_mb for s in slots}
    out: dict[str, int] = {}

    def fits_one(h: str) -> bool:
        return out.get(h, 0) < cap and room[h] - (out.get(h, 0) + 1) * charge_mb >= 0

    for h, n in sorted(current.items()):
        if h in room:
            keep = min(n, cap, max(0, room[h] // max(charge_mb, 1)))
            if keep > 0:
                out[h] = keep
    total = sum(out.values())
    while total > size:  # shrink the fullest first
        h = max(out, key=lambda x: (out[x], x))
        out[h] -= 1
        if out[h] == 0:
            del out[h]
        total -= 1
    ids = sorted(room)
    while total < size:
        open_ = [h for h in ids if fits_one(h)]
        if not open_:
            break
        picks = rng.sample(open_, min(k, len(open_)))
        h = max(picks, key=lambda x: (room[x] - out.get(x, 0) * charge_mb, -out.get(x, 0), x))
        out[h] = out.get(h, 0) + 1
        total += 1
    while out:  # level: the fullest gives one to the emptiest that has room
        full = max(out, key=lambda x: (out[x], x))
        takers = [h for h in ids if fits_one(h) and out.get(h, 0) < out[full] - 1]
        if not takers:
            break
        h = min(takers, key=lambda x: (out.get(x, 0), -room[x], x))
        out[full] -= 1
        out[h] = out.get(h, 0) + 1
        if out[full] == 0:
            del out[full]
    return out


def pick_warm(candidates: Sequence[tuple[H, int]], rng: random.Random) -> tuple[H, int]:
    """Power-of-2 over hosts advertising ready warm sandboxes: the warmer of two sampled ones. Not the
    warmest of all: over an inventory some seconds old, every claim of a burst would go to that one
    host and drain it while its peers stay full."""
    if len(candidates) == 1:
        return candidates[0]
    a, b = rng.sample(list(candidates), 2)
    return a if a[1] >= b[1] else b
