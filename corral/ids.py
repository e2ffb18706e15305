"""Unique ids without a syscall each: a generator seeded once from the OS (and again in every forked
child, which would otherwise draw its parent's sequence). Ids must not collide; they are not secrets
(tokens come from ``secrets``)."""

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
