"""The sandboxes an agent accounts for, with the host's admission book kept in step: the set the gate
charges at every start, the heartbeat lists and the sampling between heartbeats reads."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping

from corral.core.admission import AdmissionBook
from corral.core.samples import SampleLog
from corral.core.settle import SettleRule
from corral.core.types import SandboxUsage
from corral.runtime.base import SandboxSpec


class Live:
    """A sandbox the agent accounts for."""

    __slots__ = ("observed_mb", "oom_kills", "paused", "samples", "spec", "started_at", "trusted", "usage")

    def __init__(self, spec: SandboxSpec, started_at: float) -> None:
        self.spec = spec
        self.started_at = started_at
        # What the gate charges, kept ready: the gate runs over every live sandbox at every start.
        # resident_mb stays None (charged the reserve) until a measurement sees it settled.
        self.usage = SandboxUsage(spec.memory_mb, None, spec.stateful)
        # The latest reading of any age, for the host's memory_mb_used.
        self.observed_mb: int | None = None
        self.oom_kills = 0  # processes the kernel's OOM killer killed in it, as last read
        # Whether readings have replaced the reserve (see ``SettleRule``); once true, it stays.
        self.trusted = False
        self.paused = False  # frozen by pause(); the runtime holds the truth, this its latest word
        self.samples = SampleLog()  # its readings over time, for E2B's get_metrics

    @property
    def resident_mb(self) -> int | None:
        return self.usage.resident_mb

    def settled_at(self, resident_mb: int) -> None:
        if resident_mb != self.usage.resident_mb:
            self.usage = SandboxUsage(self.spec.memory_mb, resident_mb, self.spec.stateful)


class LiveSet(Mapping[str, Live]):
    """The live sandboxes, with the host's admission book and observed total kept in step, so the
    gate at every start costs O(1) however many sandboxes the host runs. A read-only mapping plus
    the few writes below: nothing can change the set without the book hearing of it."""

    def __init__(self, book: AdmissionBook) -> None:
        self._items: dict[str, Live] = {}
        self.book = book
        self.observed_mb = 0
        # Still charged their reserve. Those old enough to settle are what the sampling between
        # heartbeats reads: found through a heap by start time, so a burst of young sandboxes costs
        # that sampling nothing until they come of age.
        self._young: list[tuple[float, str]] = []
        self._of_age: set[str] = set()
        # Added or removed, and removed, since the last heartbeat was built: what its listing checks.
        self.touched: set[str] = set()
        self.dropped: set[str] = set()
        self.cpus = 0.0  # their CPUs, summed as they come and go
        # Told of every entry that leaves (whatever removed it): what it held goes with it.
        self.on_gone: Callable[[str, Live], None] | None = None

    def __getitem__(self, key: str) -> Live:
        return self._items[key]

    def get(self, key: str, default: Live | None = None) -> Live | None:  # type: ignore[override]
        # The mapping's own, not the mixin's: a miss (every start) would raise and catch a KeyError.
        return self._items.get(key, default)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __setitem__(self, key: str, value: Live) -> None:
        self.pop(key, None)
        self._items[key] = value
        self.book.put(key, value.usage)
        self.observed_mb += value.observed_mb or 0
        self.cpus += value.spec.cpus
        self.touched.add(key)
        if not value.trusted:
            heapq.heappush(self._young, (value.started_at, key))

    def __delitem__(self, key: str) -> None:
        if self.pop(key, None) is None:
            raise KeyError(key)

    def pop(self, key: str, default: Live | None = None) -> Live | None:
        old = self._items.pop(key, None)
        if old is None:
            return default
        self.book.remove(key)
        self.observed_mb -= old.observed_mb or 0
        self.cpus -= old.spec.cpus
        self._of_age.discard(key)
        self.touched.add(key)
        self.dropped.add(key)
        if self.on_gone is not None:
            self.on_gone(key, old)
        return old

    def take_changes(self) -> tuple[set[str], set[str]]:
        """(touched, dropped) since the last call, handed over and forgotten here."""
        touched, dropped = self.touched, self.dropped
        self.touched, self.dropped = set(), set()
        return touched, dropped

    @property
    def untrusted(self) -> set[str]:
        """Those still charged their reserve (derived: only a test asks)."""
        return {k for k, v in self._items.items() if not v.trusted}

    def settling(self, started_by: float) -> set[str]:
        """The untrusted sandboxes started at or before ``started_by`` (the caller must not keep the
        set: it changes as they settle)."""
        while self._young and self._young[0][0] <= started_by:
            started_at, key = heapq.heappop(self._young)
            live = self._items.get(key)
            # An entry of a sandbox since trusted, gone or replaced is dropped here.
            if live is not None and not live.trusted and live.started_at == started_at:
                self._of_age.add(key)
        return self._of_age

    def measured(self, key: str, observed_mb: int, rule: SettleRule, now: float) -> bool:
        """Record a reading; returns whether this reading is the one that made the sandbox trusted."""
        live = self._items[key]
        newly = not live.trusted and rule.trusted(now - live.started_at, observed_mb, live.observed_mb)
        self.observed_mb += observed_mb - (live.observed_mb or 0)
        live.observed_mb = observed_mb
        live.samples.add(now, observed_mb)
        if newly:
            live.trusted = True
            self._of_age.discard(key)
        if live.trusted:
            live.settled_at(observed_mb)
            self.book.put(key, live.usage)
        return newly
