"""Children started off the event loop (corral.runtime.child) behave as asyncio's subprocesses do for
the runtime, on the stdlib loop and on uvloop (the servers' loop): output, input with backpressure,
exit statuses, no wait on a grandchild's pipes, and descriptors closed exactly once however many
starts run at once."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from corral.runtime import child

Runner = Callable[[Coroutine[Any, Any, None]], None]
RUNNERS = [pytest.param(asyncio.run, id="asyncio"), pytest.param(uvloop.run, id="uvloop")]


def _open_fds() -> set[int]:
    return {int(fd) for fd in os.listdir("/proc/self/fd")}


@pytest.mark.parametrize("run", RUNNERS)
def test_output_input_and_exit_status(run: Runner) -> None:
    async def main() -> None:
        c = await child.start(
            ["/bin/sh", "-c", "cat; echo oops >&2; exit 3"], env={}, pass_fds=(), stdin=True
        )
        assert c.stdin is not None and c.returncode is None
        stdin = c.stdin

        async def feed() -> None:
            stdin.write(b"x" * 1_000_000)  # far past the pipe and the transport's high-water mark
            await stdin.drain()
            stdin.close()

        _, out, err = await asyncio.gather(feed(), c.stdout.read(), c.stderr.read())
        assert (len(out), err, await c.wait(), c.returncode) == (1_000_000, b"oops\n", 3, 3)

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_a_signal_and_a_grandchild_holding_the_pipes(run: Runner) -> None:
    async def main() -> None:
        killed = await child.start(["sleep", "600"], env={}, pass_fds=(), stdin=False)
        os.killpg(killed.pid, signal.SIGKILL)
        assert await killed.wait() == -signal.SIGKILL
        # The child exits at once; its background grandchild keeps stdout open for a minute.
        held = await child.start(
            ["/bin/sh", "-c", "sleep 60 & echo started"], env={}, pass_fds=(), stdin=False
        )
        assert await asyncio.wait_for(held.wait(), 30) == 0
        assert await held.stdout.readline() == b"started\n"
        os.killpg(held.pid, signal.SIGKILL)

    run(main())


@pytest.mark.parametrize("run", RUNNERS)
def test_many_starts_at_once_close_every_descriptor_once(run: Runner) -> None:
    before = _open_fds()

    async def main() -> None:
        script = "head -c 200000 /dev/zero; echo done >&2"
        children = await asyncio.gather(
            *(
                child.start(["/bin/sh", "-c", script], env={}, pass_fds=(), stdin=i % 2 == 0)
                for i in range(64)
            )
        )
        for c in children:
            if c.stdin is not None:
                c.stdin.close()
        results = await asyncio.gather(
            *(asyncio.gather(c.stdout.read(), c.stderr.read(), c.wait()) for c in children)
        )
        assert all(len(out) == 200_000 and err == b"done\n" and code == 0 for out, err, code in results)
        await asyncio.sleep(0.05)  # the transports' connection_lost callbacks

    run(main())
    assert _open_fds() <= before  # every pipe and pidfd closed (a second close would have raised)


@pytest.mark.parametrize("run", RUNNERS)
def test_an_unread_stream_holds_the_writer_back(run: Runner) -> None:
    async def main() -> None:
        c = await child.start(
            ["/bin/sh", "-c", "head -c 10000000 /dev/zero; echo finished >&2"],
            env={},
            pass_fds=(),
            stdin=False,
        )
        await asyncio.sleep(0.5)
        assert c.returncode is None  # blocked on a full pipe: nobody reads its stdout
        assert len(await c.stdout.read()) == 10_000_000
        assert await c.stderr.read() == b"finished\n" and await c.wait() == 0

    run(main())
