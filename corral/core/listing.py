"""The digest of a host's sandbox listing: what lets a heartbeat carry only what changed.

A listing is the set of (sandbox id, epoch) a host runs for records (warm sandboxes excluded). Its
digest is the XOR of one hash per entry, so it is independent of order and follows each change in
O(1) on both sides: the agent and the store each fold the same changes into the digest they hold, and a
heartbeat whose digest differs from what the store's copy folds to proves the copies diverged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

# 63 bits: a digest fits a signed 64-bit column on every backend, and XOR keeps it there.
_BITS = 63


def entry_hash(sandbox_id: str, epoch: int) -> int:
    h = hashlib.blake2b(f"{sandbox_id}\0{epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") >> (64 - _BITS)


def fold(digest: int, entries: Iterable[tuple[str, int]]) -> int:
    """``digest`` with each entry toggled: in if it was out, out if it was in."""
    for sandbox_id, epoch in entries:
        digest ^= entry_hash(sandbox_id, epoch)
    return digest


def digest_of(listing: Mapping[str, int]) -> int:
    """The digest of a whole listing (sandbox id -> epoch)."""
    return fold(0, listing.items())


def changes(base: Mapping[str, int], now: Mapping[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """(added, removed) that turn ``base`` into ``now``: an entry whose epoch changed is in both, with
    its new epoch in ``added`` and its old one in ``removed``."""
    added = dict(now.items() - base.items())
    removed = {sid: base[sid] for sid in base.keys() - now.keys()}
    removed.update((sid, base[sid]) for sid in added if sid in base)
    return added, removed
