"""The garbage collector tuned for a long-running server.

A request allocates thousands of short-lived objects: at the default threshold (700) a young
collection runs every few requests and scans everything young, about a tenth of a busy server's time,
so young collections run far less often here. What start-up built (modules, the app, the fleet) is
frozen out of the collector's sight. A full collection scans every object not frozen: as a fleet grows,
so does that pause, until it alone sets the tail latency of every request in flight. So the survivors
of each full collection are frozen too, and the next one scans only what arrived since. Cyclic garbage
among frozen objects cannot be reclaimed while they are frozen: every ``THAW_EVERY_S`` they are thawed,
collected once in full, and frozen again, which bounds what such garbage can hold to that interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from typing import Any

GEN0_THRESHOLD = 50_000
THAW_EVERY_S = 600.0


def _freeze_after_full(phase: str, info: dict[str, Any]) -> None:
    # At once, in the collection's own callback: only its survivors, nothing allocated after it.
    if phase == "stop" and info["generation"] == 2:
        gc.freeze()


async def _thaw_now_and_then(every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        gc.unfreeze()
        gc.collect()
        gc.freeze()


@contextlib.asynccontextmanager
async def tuned(every_s: float = THAW_EVERY_S) -> AsyncIterator[None]:
    """Tune the collector for the life of the block (once start-up is done); put back as it was after."""
    thresholds = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, thresholds[1], thresholds[2])
    gc.callbacks.append(_freeze_after_full)
    thaw = asyncio.get_running_loop().create_task(_thaw_now_and_then(every_s), name="corral-gc-thaw")
    try:
        yield
    finally:
        thaw.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await thaw
        gc.callbacks.remove(_freeze_after_full)
        gc.set_threshold(*thresholds)
        gc.unfreeze()
