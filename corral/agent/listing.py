"""The agent's side of its listing: which heartbeat's sandboxes the control plane acknowledged, and
what changed since, so a heartbeat carries changes instead of every sandbox the host runs, and costs
the agent what changed too.

The rule that keeps the two sides from diverging without either knowing: an acknowledgement is the
reply's ``listed_seq`` naming the very heartbeat just sent. Anything else (no reply, a reply that names
another heartbeat, a control plane that predates changes, a restart of either side) leaves nothing
acknowledged, and the next heartbeat carries the whole set, which the control plane takes as it is.
A heartbeat lost, delayed, duplicated or overtaken is either dropped by its seq or builds on a base
the control plane no longer holds, and is then answered with a request for the whole set.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from corral.core.listing import digest_of, fold


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One heartbeat's listing as the agent built it. ``base`` None: the whole set (``added``)."""

    seq: int
    base: int | None
    added: dict[str, int]
    removed: dict[str, int]  # with the epochs the acknowledged listing had
    gone: frozenset[str]  # what the heartbeat reports gone: ``removed`` and what never got listed
    digest: int


class ListingTracker:
    def __init__(self) -> None:
        # The listing the control plane acknowledged (sandbox id -> epoch), its heartbeat's seq and digest.
        self._acked: dict[str, int] | None = None
        self._acked_seq = 0
        self._acked_digest = 0

    @property
    def acked_seq(self) -> int | None:
        return self._acked_seq if self._acked is not None else None

    def next(self, seq: int, owned: Mapping[str, int], touched: Set[str], dropped: Set[str]) -> Outgoing:
        """The listing of heartbeat ``seq``. ``owned`` is what the host runs for records (sandbox id ->
        epoch); ``touched`` the ids whose entry may have changed since the previous heartbeat was
        built, ``dropped`` those that left the host since then, listed or not: one that started and
        ended between two heartbeats is still reported gone, so a record that says it runs here is
        found out without reading every record."""
        acked = self._acked
        if acked is None:
            whole = dict(owned)
            return Outgoing(seq, None, whole, {}, frozenset(), digest_of(whole))
        added = {i: owned[i] for i in touched if i in owned and acked.get(i) != owned[i]}
        removed = {i: acked[i] for i in touched if i in acked and acked[i] != owned.get(i)}
        digest = fold(fold(self._acked_digest, removed.items()), added.items())
        gone = frozenset(removed.keys() | {i for i in dropped if i not in owned})
        return Outgoing(seq, self._acked_seq, added, removed, gone, digest)

    def acknowledged(self, sent: Outgoing, listed_seq: int | None) -> None:
        """The reply to ``sent`` said the control plane holds heartbeat ``listed_seq``'s listing (None:
        no reply, or a control plane that takes whole sets only)."""
        if listed_seq != sent.seq:
            self._acked = None
            return
        if sent.base is None or self._acked is None:
            self._acked = dict(sent.added)
        else:
            for i in sent.removed:
                self._acked.pop(i, None)
            self._acked.update(sent.added)
        self._acked_seq = sent.seq
        self._acked_digest = sent.digest
