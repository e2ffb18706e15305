"""Watches woken by the same changes share one read of them: however many ask at once, the store is
asked once; a watch that goes away does not cancel the others' read; a failed read is asked again."""

from __future__ import annotations

import asyncio

import pytest

from corral.api.kube.shared import SharedReads
from corral.store import ChangeRecord, StoreError


def change(version: int, key: str = "sb-1") -> ChangeRecord:
    return ChangeRecord(version, "sandbox", key, "t", None, False)


async def test_a_hundred_watches_asking_at_once_read_once() -> None:
    shared, calls, gate = SharedReads(), [], asyncio.Event()

    async def load(changes: list[ChangeRecord]) -> dict[str, int]:
        calls.append([c.version for c in changes])
        await gate.wait()
        return {c.key: c.version for c in changes}

    batch = [change(1, "a"), change(2, "b")]
    waiters = [asyncio.create_task(shared.read("sandbox", batch, load)) for _ in range(100)]
    await asyncio.sleep(0)
    waiters[0].cancel()  # one watch goes away mid-read
    gate.set()
    done = await asyncio.gather(*waiters[1:])
    assert calls == [[1, 2]]
    assert all(got == [{"a": 1, "b": 2}] for got in done)
    # A later change is read anew; the earlier ones are not read again.
    assert await shared.read("sandbox", [*batch, change(3, "c")], load) == [{"a": 1, "b": 2}, {"c": 3}]
    assert calls == [[1, 2], [3]]
    # Another kind's read of the same version is its own.
    await shared.read("pool", [change(1)], load)
    assert len(calls) == 3


async def test_a_failed_read_is_asked_again() -> None:
    shared, calls = SharedReads(), []

    async def load(changes: list[ChangeRecord]) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise StoreError("down")
        return len(calls)

    with pytest.raises(StoreError):
        await shared.read("sandbox", [change(1)], load)
    assert await shared.read("sandbox", [change(1)], load) == [2]


async def test_it_remembers_a_bounded_number_of_changes() -> None:
    shared = SharedReads(keep=10)

    async def load(changes: list[ChangeRecord]) -> int:
        return len(changes)

    for v in range(100):
        await shared.read("sandbox", [change(v)], load)
    assert len(shared._reads) == 10
