"""One replica's follower of the store's change feed: woken by the store (PostgreSQL's NOTIFY, or
SQLite's own commits), it reads what changed once, keeps the newest changes in memory, and wakes
every watch on this replica; however many watches are open, a change costs one read here."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from corral.store import ChangeRecord, Store, StoreError

log = logging.getLogger("corral.kube")

# Changes kept in the store's history (the leader prunes the rest): how far back a watch may resume.
HISTORY = 100_000
# Changes kept in this replica's memory, served to watches without a store read.
MEMORY = 4096
_BATCH = 1000


class Expired(Exception):
    """A watch asked to resume from a version the history no longer holds."""


class ChangeHub:
    def __init__(self, store: Store, memory: int = MEMORY) -> None:
        self.store = store
        self.recent: deque[ChangeRecord] = deque(maxlen=memory)
        self.latest = 0
        # Set when changes arrive, and replaced by a new one: every waiting watch wakes in one pass
        # (a Condition hands its lock from one waiter to the next, one loop turn each).
        self._arrived = asyncio.Event()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stop: Callable[[], None] | None = None
        self._start_lock = asyncio.Lock()

    async def start(self) -> None:
        if self._task is not None:
            return
        async with self._start_lock:
            if self._task is not None:
                return
            self._stop = self.store.on_change(self._wake.set)
            self.latest = (await self.store.change_bounds())[1]
            self._task = asyncio.get_running_loop().create_task(self._follow(), name="corral-kube-feed")

    async def stop(self) -> None:
        if self._stop is not None:
            self._stop()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _follow(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                while True:
                    batch = await self.store.changes_since(self.latest, limit=_BATCH)
                    if not batch:
                        break
                    self.recent.extend(batch)
                    self.latest = batch[-1].version
                    arrived, self._arrived = self._arrived, asyncio.Event()
                    arrived.set()
                    if len(batch) < _BATCH:
                        break
            except StoreError as exc:
                log.warning("change feed unreadable: %s", exc)
                await asyncio.sleep(0.5)
                self._wake.set()

    async def check(self, version: int) -> None:
        """Raise :class:`Expired` if the history no longer reaches back to ``version``."""
        oldest, latest = await self.store.change_bounds()
        if version < oldest or version > max(latest, self.latest):
            raise Expired(f"too old resource version: {version} ({oldest})")

    async def after(self, version: int, timeout: float) -> list[ChangeRecord]:
        """Changes after ``version``, waiting up to ``timeout`` for the first one; [] if none came."""
        got = await self._read(version)
        if got:
            return got
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # no task per wait, as wait_for makes
                while self.latest <= version:
                    await self._arrived.wait()
        return await self._read(version)

    async def _read(self, version: int) -> list[ChangeRecord]:
        if version >= self.latest:
            return []
        if self.recent and self.recent[0].version <= version + 1:
            # The newest first, back to ``version``: a watch is rarely far behind, the memory long.
            newer = []
            for c in reversed(self.recent):
                if c.version <= version:
                    break
                newer.append(c)
            return newer[::-1]
        got = await self.store.changes_since(version, limit=_BATCH)
        if got and got[0].version != version + 1:
            raise Expired(f"too old resource version: {version}")
        return got
