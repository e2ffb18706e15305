"""The starts limiter: a circuit breaker that refuses fast and retryably, never a queue."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import httpx
import pytest
from agent_doubles import TOKEN, GatedRuntime

from corral.agent import Agent, AgentRefusal, StartSandbox, StartsLimiter, StartsSaturated
from corral.agent.http import create_app
from corral.codes import ErrorCode
from corral.core import ManualClock


async def test_ninth_concurrent_start_is_refused_without_waiting_for_the_others(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = GatedRuntime(clock, random.Random(1))
    agent = make_agent(runtime=runtime, max_concurrent_starts=8, memory_mb_total=1 << 20)
    slow = [asyncio.create_task(agent.start(StartSandbox(id=f"s{i}", memory_mb=512))) for i in range(8)]
    await runtime.wait_entered(8)

    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="ninth", memory_mb=512))
    assert refused.value.code == ErrorCode.HOST_STARTS_SATURATED
    assert refused.value.retryable and refused.value.retry_after_s
    assert refused.value.details == {"in_flight": 8, "limit": 8}
    # Refused while every slow start was still in flight: it did not queue behind them.
    assert not any(t.done() for t in slow)
    assert runtime.entered == 8  # and it never reached the runtime

    runtime.open()
    assert len(await asyncio.gather(*slow)) == 8
    # A refusal is about right now: once the slots free up, the same start goes through.
    assert (await agent.start(StartSandbox(id="ninth", memory_mb=512))).id == "ninth"
    assert agent.refusals == {ErrorCode.HOST_STARTS_SATURATED: 1}


async def test_saturated_is_a_503_with_retry_after_over_http(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    runtime = GatedRuntime(clock, random.Random(1))
    agent = make_agent(runtime=runtime, max_concurrent_starts=2, memory_mb_total=1 << 20)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(agent, TOKEN)), base_url="http://a"
    ) as c:
        slow = [
            asyncio.create_task(c.post("/v1/sandboxes", json={"id": f"s{i}", "memory_mb": 512}, headers=auth))
            for i in range(2)
        ]
        await runtime.wait_entered(2)
        r = await c.post("/v1/sandboxes", json={"id": "third", "memory_mb": 512}, headers=auth)
        assert not any(t.done() for t in slow)
        runtime.open()
        assert [t.status_code for t in await asyncio.gather(*slow)] == [201, 201]
    assert r.status_code == 503
    assert int(r.headers["Retry-After"]) >= 1
    assert r.json()["error"]["code"] == "host_starts_saturated"


async def test_a_slot_freed_within_the_wait_is_handed_over() -> None:
    limiter = StartsLimiter(limit=2, wait_s=30.0)
    await limiter.acquire()
    await limiter.acquire()
    waiter = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    assert not waiter.done()
    limiter.release()
    await waiter  # got the released slot
    assert limiter.in_flight == 2
    limiter.release()
    limiter.release()
    assert limiter.in_flight == 0


async def test_waiters_are_served_in_order_and_refused_ones_leave_no_trace() -> None:
    limiter = StartsLimiter(limit=1, wait_s=30.0)
    await limiter.acquire()
    order: list[int] = []

    async def take(n: int) -> None:
        await limiter.acquire()
        order.append(n)

    tasks = [asyncio.create_task(take(n)) for n in range(3)]
    await asyncio.sleep(0)
    for _ in range(3):
        limiter.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2]
    limiter.release()
    assert limiter.in_flight == 0

    quick = StartsLimiter(limit=1, wait_s=0.0)
    await quick.acquire()
    with pytest.raises(StartsSaturated):
        await quick.acquire()
    quick.release()
    await quick.acquire()  # the refused waiter did not keep a place in line
    assert quick.in_flight == 1 and quick.refused_total == 1


async def test_a_waiter_cancelled_after_the_handover_passes_the_slot_on() -> None:
    limiter = StartsLimiter(limit=1, wait_s=30.0)
    await limiter.acquire()
    first = asyncio.create_task(limiter.acquire())
    second = asyncio.create_task(limiter.acquire())
    await asyncio.sleep(0)
    limiter.release()  # hands the slot to `first`...
    first.cancel()  # ...which is cancelled before it could run
    with pytest.raises(asyncio.CancelledError):
        await first
    await second  # the slot was passed on, not lost
    assert limiter.in_flight == 1
    limiter.release()
    assert limiter.in_flight == 0


def test_limiter_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        StartsLimiter(limit=0)
    with pytest.raises(RuntimeError):
        StartsLimiter().release()
