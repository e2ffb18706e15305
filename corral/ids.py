"""Unique ids without a syscall each: a generator seeded once from the OS (and again in every forked
child, which would otherwise draw its parent's sequence). Ids must not collide; they are not secrets
(tokens come from ``secrets``).

Ids that are primary keys of rows written on every create lead with their creation time, so a new row's
index entry lands beside the last one's: random keys scatter each insert onto a page of its own, and
every such page is written out again at commit."""

from __future__ import annotations

import os
import random

_ids = random.Random()


def _seed() -> None:
    _ids.seed(int.from_bytes(os.urandom(16), "big"))


_seed()
os.register_at_fork(after_in_child=_seed)


def reseed(value: str | None) -> None:
    """Draw ids from a sequence fixed by ``value`` (a simulation replays its run exactly); None: back
    to a seed from the OS."""
    if value is None:
        _seed()
    else:
        _ids.seed(value)


def random_hex(bits: int) -> str:
    """``bits`` random bits as lower-case hex, zero-padded."""
    return f"{_ids.getrandbits(bits):0{(bits + 3) // 4}x}"


def time_ordered_hex(now: float, bits: int) -> str:
    """The millisecond of ``now`` (11 hex digits, ordered until the year 7545), then ``bits`` random
    bits: ids made later sort later, those of one millisecond in any order."""
    return f"{max(0, int(now * 1000)):011x}{random_hex(bits)}"


def new_sandbox_id(now: float) -> str:
    """A sandbox's id, ordered by ``now`` (the caller's clock: a simulation's ids replay)."""
    return f"sb-{time_ordered_hex(now, 52)}"
