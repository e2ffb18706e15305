"""The harness's processes: what a replica's crash does to the work it was doing."""

from __future__ import annotations

import asyncio

from corral.sim.flow.harness import Process
from corral.sim.flow.vtime import run_virtual


def test_a_crash_cancels_a_processs_tasks_in_the_order_they_were_spawned() -> None:
    # Whatever their ids: an order that followed where tasks live in memory would make a run with a
    # crash differ from its own replay in the same process.
    async def main() -> list[int]:
        p = Process()
        stopped: list[int] = []

        async def work(i: int) -> None:
            try:
                await asyncio.sleep(60.0)
            except asyncio.CancelledError:
                stopped.append(i)
                raise

        for i in range(200):
            p.spawn(work(i))
        await asyncio.sleep(1.0)
        p.crash()
        await asyncio.sleep(1.0)
        assert not p.alive and not p.tasks  # every task ended and left the process
        return stopped

    assert run_virtual(main()) == list(range(200))
