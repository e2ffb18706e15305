"""One timer for many awaits under the same limit: each behaves as under ``asyncio.timeout``."""

from __future__ import annotations

import asyncio

import pytest

from corral.control.deadlines import Deadlines

HANG_S = 30.0  # far past every deadline below: an await that is still waiting


async def test_an_await_past_its_deadline_raises_timeout_and_leaves_its_task_usable() -> None:
    d = Deadlines(0.02)
    with pytest.raises(TimeoutError), d.watch():
        await asyncio.sleep(HANG_S)
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0
    await asyncio.sleep(0.03)  # nothing left to cancel this task later
    assert len(d) == 0


async def test_an_await_in_time_returns_and_is_never_cancelled_afterwards() -> None:
    d = Deadlines(0.05)

    async def quick() -> int:
        await asyncio.sleep(0)
        return 7

    with d.watch():
        got = await quick()
    assert got == 7
    await asyncio.sleep(0.1)  # past the deadline it had: the timer must not touch this task now
    assert len(d) == 0


async def test_a_cancellation_from_elsewhere_stays_a_cancellation() -> None:
    d = Deadlines(HANG_S)

    async def bind() -> None:
        with d.watch():
            await asyncio.sleep(HANG_S)

    task = asyncio.create_task(bind())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(d) == 0


async def test_only_the_overdue_among_many_time_out_and_the_queue_drains() -> None:
    d = Deadlines(1.0)
    release = asyncio.Event()

    async def bind(hang: bool) -> str:
        with d.watch():
            if hang:
                await asyncio.sleep(HANG_S)
            else:
                await release.wait()
        return "ok"

    hanging = [asyncio.create_task(bind(True)) for _ in range(3)]
    await asyncio.sleep(0.01)
    answered = [asyncio.create_task(bind(False)) for _ in range(20)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*answered) == ["ok"] * 20
    for t in hanging:
        with pytest.raises(TimeoutError):
            await t
    assert len(d) == 0


async def test_a_deadline_set_later_is_still_kept_once_earlier_watches_are_gone() -> None:
    d = Deadlines(0.05)

    async def bind(hold_s: float) -> None:
        with d.watch():
            await asyncio.sleep(hold_s)

    first = asyncio.create_task(bind(0))
    await first  # the head leaves before its deadline: the timer set for it finds nothing due
    late = asyncio.create_task(bind(HANG_S))
    with pytest.raises(TimeoutError):
        await late


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError):
        Deadlines(0)


async def test_a_cancellation_from_elsewhere_stays_one_when_the_deadline_passes_during_its_clean_up() -> None:
    d = Deadlines(0.05)
    cancelled = asyncio.Event()

    async def bind() -> None:
        with d.watch():
            try:
                await asyncio.sleep(HANG_S)
            except asyncio.CancelledError:
                cancelled.set()
                await asyncio.sleep(HANG_S)  # cleaning up, past the deadline, which cancels it again
                raise

    task = asyncio.create_task(bind())
    await asyncio.sleep(0)
    task.cancel()
    await cancelled.wait()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


def test_watches_on_a_later_loop_still_time_out() -> None:
    d = Deadlines(0.05)

    async def quick() -> None:
        with d.watch():
            await asyncio.sleep(0)

    async def hangs() -> None:
        with d.watch():
            await asyncio.sleep(HANG_S)

    asyncio.run(quick())  # the loop ends with a timer set for it still pending
    with pytest.raises(TimeoutError):
        asyncio.run(hangs())
