"""Round-robin across keys: each key's items in the order they came, the keys taking turns.

What the create path's gate hands its free slots by, so one tenant's thousand waiting creates delay
another tenant's first by at most one turn, not by a thousand. Pure and synchronous.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

# Creates one replica works on at once: enough to keep its store and agents busy, few enough that a
# tenant's burst waits in turns instead of crowding every other tenant's create off the event loop.
DEFAULT_CREATES_IN_FLIGHT = 16


class RoundRobin(Generic[T]):
    def __init__(self) -> None:
        # Keys with items waiting, in turn order: the first is served next, then goes to the back.
        self._queues: OrderedDict[str, deque[T]] = OrderedDict()
        self._size = 0

    def push(self, key: str, item: T) -> None:
        """A key that had nothing waiting joins at the back of the turn order."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        queue.append(item)
        self._size += 1

    def pop(self) -> tuple[str, T] | None:
        """The next key's oldest item (None when nothing waits); that key goes to the back."""
        if not self._queues:
            return None
        key, queue = next(iter(self._queues.items()))
        item = queue.popleft()
        self._size -= 1
        if queue:
            self._queues.move_to_end(key)
        else:
            del self._queues[key]
        return key, item

    def remove(self, key: str, match: Callable[[T], bool]) -> bool:
        """Withdraw the first of ``key``'s items ``match`` accepts; True if one was there."""
        queue = self._queues.get(key)
        if queue is None:
            return False
        for i, item in enumerate(queue):
            if match(item):
                del queue[i]
                self._size -= 1
                if not queue:
                    del self._queues[key]
                return True
        return False

    def waiting(self, key: str) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def __len__(self) -> int:
        return self._size
