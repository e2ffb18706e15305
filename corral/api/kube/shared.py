"""What a change's watch events read, read once on this replica: every watch the same changes wake
asks at once, the first asks the store and the others wait on its answer. The read is of the records
as they are now (at or after the change), as each watch's own read would be; a failed read is
forgotten, so the next asks again."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from corral.store import ChangeRecord

T = TypeVar("T")
K = TypeVar("K")
KEEP = 4096  # changes remembered: more than one batch of the feed (1,000)


class SharedReads:
    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._reads: OrderedDict[tuple[str, int], asyncio.Future[Any]] = OrderedDict()

    async def read(
        self,
        tag: str,
        changes: Sequence[ChangeRecord],
        load: Callable[[list[ChangeRecord]], Awaitable[T]],
    ) -> list[T]:
        """The answers that cover ``changes``: ``load`` of those no watch has read yet, and the reads
        already made (or under way) of the others, oldest first."""
        missing = [c for c in changes if (tag, c.version) not in self._reads]
        if missing:
            task: asyncio.Future[T] = asyncio.ensure_future(load(missing))
            keys = [(tag, c.version) for c in missing]
            task.add_done_callback(lambda t: self._forget_failed(t, keys))
            for k in keys:
                self._reads[k] = task
        futures: dict[int, asyncio.Future[Any]] = {}
        for c in changes:
            f = self._reads.get((tag, c.version))
            if f is not None:
                futures.setdefault(id(f), f)
        while len(self._reads) > self.keep:
            self._reads.popitem(last=False)
        # Shielded: a watch that goes away must not cancel the read the others wait on.
        return [await asyncio.shield(f) for f in futures.values()]

    def _forget_failed(self, task: asyncio.Future[Any], keys: list[tuple[str, int]]) -> None:
        if task.cancelled() or task.exception() is not None:
            for k in keys:
                if self._reads.get(k) is task:
                    del self._reads[k]


class Memo(Generic[K, T]):
    """What every watch on this replica shows of one change (its object, its encoded event), made by
    the first watch that needs it and kept for the newest ``keep`` keys. A key names all that the
    value depends on, so a value kept is the one any watch would have made."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._got: OrderedDict[K, T] = OrderedDict()

    def get(self, key: K) -> T | None:
        return self._got.get(key)

    def put(self, key: K, value: T) -> T:
        self._got[key] = value
        if len(self._got) > self.keep:
            self._got.popitem(last=False)
        return value
