"""Whether a request fits a host, and how good a host that fits is, declared once as data.

The core evaluates these declarations (``corral.core.admission``, ``corral.core.scoring``) and the store
renders the very same ones to SQL (``corral.store.sql``), so the scheduler's filters and the store's
race-proof reservation cannot disagree about a host.

A host takes a request when it is ``TAKES_STATE`` and every bound of ``FIT_RULE`` holds. A bound says
``need <= room`` (``room * cpu_overcommit`` for an overcommitted resource); ``need`` is a sum of terms,
added left to right on both sides. Memory is never overcommitted (it kills); CPU is (it degrades). The
memory request term is a *charge*: ``request_charge_mb`` under the host's admission mode, so a stateful
request is charged in full and the host's own ``admittable`` already charged its live sandboxes alike.

Among hosts that fit, the spread score's terms are what each bound leaves, ``room - need``, as a
fraction of the host's total (a large host does not win over an emptier small one).

Ties between equally good hosts are broken by ``tie_rank``: a hash of the host id salted per request.
Deterministic for a request (a retried create, or a test, sees the same order), uniform across hosts
from one request to the next, so concurrent deciders offered the same tied hosts spread over them
instead of herding on the lowest id.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from corral.core.types import HostState


class Term(StrEnum):
    """A number the rule reads: a fact of the host, what is pending on it, or what the request asks."""

    ADMITTABLE_MB = "admittable_mb"  # the host's published verdict, before pending reservations
    MEMORY_TOTAL_MB = "memory_total_mb"
    PENDING_MB = "pending_mb"
    CHARGE_MB = "charge_mb"  # the request's memory charge on this host
    CPU_TOTAL = "cpu_total"
    CPU_USED = "cpu_used"
    PENDING_CPU = "pending_cpu"
    REQUEST_CPU = "request_cpu"


@dataclass(frozen=True, slots=True)
class Bound:
    name: str
    need: tuple[Term, ...]
    room: Term
    # The host's total, for the score's fraction.
    total: Term
    # Room is multiplied by the policy's ``cpu_overcommit``.
    overcommitted: bool = False

    def holds(self, values: Mapping[Term, float], cpu_overcommit: float) -> bool:
        first, *rest = self.need
        need = values[first]
        for t in rest:  # left to right, as SQL adds them (``sum`` may compensate floats)
            need = need + values[t]
        room = values[self.room]
        return need <= (room * cpu_overcommit if self.overcommitted else room)

    def left(self, values: Mapping[Term, float]) -> float:
        """What the host has left once the need is met (not overcommitted: the score's view)."""
        left = values[self.room]
        for t in self.need:
            left = left - values[t]
        return left


MEMORY = Bound(
    "memory",
    need=(Term.PENDING_MB, Term.CHARGE_MB),
    room=Term.ADMITTABLE_MB,
    total=Term.MEMORY_TOTAL_MB,
)
CPU = Bound(
    "cpu",
    need=(Term.CPU_USED, Term.PENDING_CPU, Term.REQUEST_CPU),
    room=Term.CPU_TOTAL,
    total=Term.CPU_TOTAL,
    overcommitted=True,
)
FIT_RULE: tuple[Bound, ...] = (MEMORY, CPU)
# Only a ready host takes anything; a draining one keeps what it runs.
TAKES_STATE = HostState.READY


def tie_rank(salt: str, host_id: str) -> int:
    """Where ``host_id`` stands among equally good hosts for the request salted ``salt`` (lower wins)."""
    digest = hashlib.blake2b(f"{salt}\x00{host_id}".encode(), digest_size=8).digest()
    # Signed 64 bits, so the store can hold it in a BIGINT.
    return int.from_bytes(digest, "big", signed=True)
