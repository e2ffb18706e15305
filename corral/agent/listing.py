"""The agent's side of its listing: which heartbeat's sandboxes the control plane acknowledged, and
what changed since, so a heartbeat carries changes instead of every sandbox the host runs.

The rule that keeps the two sides from diverging without either knowing: an acknowledgement is the
reply's ``listed_seq`` naming the very heartbeat just sent. Anything else (no reply, a reply that names
another heartbeat, a control plane that predates changes, a restart of either side) leaves nothing
acknowledged, and the next heartbeat carries the whole set, which the control plane takes as it is.
A heartbeat lost, delayed, duplicated or overtaken is either dropped by its seq or builds on a base
the control plane no longer holds, and is then answered with a request for the whole set.
"""

from __future__ import annotations

from dataclasses import dataclass

from corral.core.listing import changes, digest_of, fold


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One heartbeat's listing as the agent built it. ``base`` None: the whole set."""

    seq: int
    base: int | None
    owned: dict[str, int]
    added: dict[str, int]
    removed: frozenset[str]
    digest: int
    dropped: frozenset[str]


class ListingTracker:
    """``dropped`` is the live set's own record of sandboxes that left it (shared, not copied)."""

    def __init__(self, dropped: set[str]) -> None:
        # The listing the control plane acknowledged (sandbox id -> epoch), its heartbeat's seq and digest.
        self._acked: dict[str, int] | None = None
        self._acked_seq = 0
        self._acked_digest = 0
        # Sandboxes that left the host since the acknowledged listing, listed or not: one that started
        # and ended between two heartbeats is still reported gone, so a record that says it runs here
        # is found out without reading every record.
        self.dropped = dropped

    @property
    def acked_seq(self) -> int | None:
        return self._acked_seq if self._acked is not None else None

    def next(self, seq: int, owned: dict[str, int]) -> Outgoing:
        """The listing of heartbeat ``seq``, the host running ``owned`` (sandbox id -> epoch, warm ones
        left out). ``owned`` becomes the tracker's: the caller builds a fresh one each time."""
        dropped = frozenset(self.dropped)
        if self._acked is None:
            return Outgoing(seq, None, owned, owned, frozenset(), digest_of(owned), dropped)
        added, removed = changes(self._acked, owned)
        digest = fold(fold(self._acked_digest, removed.items()), added.items())
        gone = frozenset(removed.keys() | (dropped - owned.keys()))
        return Outgoing(seq, self._acked_seq, owned, added, gone, digest, dropped)

    def settle(self, sent: Outgoing, listed_seq: int | None) -> None:
        """The reply to ``sent`` said the control plane holds heartbeat ``listed_seq``'s listing (None:
        no reply, or a control plane that takes whole sets only)."""
        if listed_seq != sent.seq:
            self._acked = None
            return
        self._acked = sent.owned
        self._acked_seq = sent.seq
        self._acked_digest = sent.digest
        self.dropped -= sent.dropped
