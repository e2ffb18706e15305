"""One timeout for many awaits of the same length, watched by a single timer.

Every bind waits for its host under the same limit, so deadlines come due in the order they were set:
a queue in that order and one timer for its head serve them all, where ``asyncio.timeout`` would build
a timeout object and schedule (then cancel) a timer per bind, on every create's path. An await that
outlives its deadline is cancelled and raises ``TimeoutError``, as under ``asyncio.timeout``; a
cancellation that came from elsewhere stays a cancellation.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Iterator


class _Watch:
    __slots__ = ("deadline", "done", "fired", "task")

    def __init__(self, task: asyncio.Task[object], deadline: float) -> None:
        self.task: asyncio.Task[object] | None = task
        self.deadline = deadline
        self.done = False
        self.fired = False


class Deadlines:
    def __init__(self, timeout_s: float) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.timeout_s = timeout_s
        self._queue: deque[_Watch] = deque()
        self._timer: asyncio.TimerHandle | None = None
        # The loop the queue and its timer belong to: a loop that ended may leave a timer that will
        # never fire, and its watches are gone with it.
        self._loop: asyncio.AbstractEventLoop | None = None

    def __len__(self) -> int:
        """Watches not yet let go (those running, and finished ones behind a running one)."""
        return len(self._queue)

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """Around one await of the current task: ``TimeoutError`` if it is still waiting after
        ``timeout_s``."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Deadlines.watch() must be used inside a task")
        if loop is not self._loop:
            self._loop, self._timer = loop, None
            self._queue.clear()
        cancelling = task.cancelling()
        w = _Watch(task, loop.time() + self.timeout_s)
        self._queue.append(w)
        if self._timer is None:
            self._timer = loop.call_at(w.deadline, self._fire)
        try:
            yield
        except asyncio.CancelledError:
            if w.fired:
                w.fired = False  # its cancel is taken back here, not again below
                if task.uncancel() <= cancelling:
                    raise TimeoutError(f"no answer within {self.timeout_s:g} s") from None
            raise  # a cancellation from elsewhere
        finally:
            if w.fired:
                task.uncancel()  # cancelled, but the work ended otherwise before it saw the cancel
            w.done = True
            w.task = None
            queue = self._queue
            while queue and queue[0].done:
                queue.popleft()

    def _fire(self) -> None:
        self._timer = None
        queue = self._queue
        loop = asyncio.get_running_loop()
        now = loop.time()
        while queue and (queue[0].done or queue[0].deadline <= now):
            w = queue.popleft()
            if not w.done and w.task is not None:
                w.fired = True
                w.task.cancel()
        if queue:
            self._timer = loop.call_at(queue[0].deadline, self._fire)
