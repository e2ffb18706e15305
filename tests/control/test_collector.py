"""The server's collector: survivors of a full collection are frozen, so the next one does not scan them
again; cyclic garbage among them waits for the next thaw, and no longer."""

from __future__ import annotations

import asyncio
import gc
import weakref

from corral.api import collector


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> tuple[Node, weakref.ref[Node]]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a, weakref.ref(a)


async def test_survivors_of_a_full_collection_are_frozen_until_the_block_ends() -> None:
    before = gc.get_threshold()
    async with collector.tuned(every_s=3600):
        assert gc.get_threshold()[0] == collector.GEN0_THRESHOLD
        at_start = gc.get_freeze_count()
        kept = [Node() for _ in range(1000)]
        gc.collect()
        await asyncio.sleep(0)  # the freeze runs on the loop, after the collection
        assert gc.get_freeze_count() >= at_start + len(kept)
        # Frozen, a cycle that became garbage is not reclaimed by any collection...
        a, ref = cycle()
        gc.collect()
        await asyncio.sleep(0)
        del a
        gc.collect()
        assert ref() is not None
    # ...until the block ends: nothing stays frozen, and the thresholds are as they were.
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    gc.collect()
    assert ref() is None


async def test_frozen_cyclic_garbage_is_reclaimed_at_the_next_thaw() -> None:
    async with collector.tuned(every_s=0.01):
        a, ref = cycle()
        gc.collect()
        await asyncio.sleep(0)
        del a
        gc.collect()
        for _ in range(500):
            if ref() is None:
                break
            await asyncio.sleep(0.01)
        assert ref() is None
