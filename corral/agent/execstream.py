"""A command run through the exec route with its output streamed as it comes (``POST
/v1/sandboxes/{id}/exec/stream``): started through the runtime's ``spawn``, the same seam the E2B data
plane streams through, killed at its timeout, and killed when its caller goes away (``close`` before
its end), never left running with nobody to answer to.

Its output is read a chunk at a time into a short queue, so a caller that does not read holds the
command's writes back (backpressure) rather than growing the agent's memory. Nothing is kept: the
caller has seen every byte, so the closing :class:`ExecResult` carries no output, only how it ended.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Literal, Protocol, TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from corral.codes import ErrorCode
from corral.exec_result import (
    KEEPALIVE_S,
    STREAM_MEDIA_TYPE,
    ExecEvent,
    ExecOutput,
    ExecResult,
    ExecStreamError,
    encode_event,
)
from corral.runtime.stream import Spawned

log = logging.getLogger("corral.exec")
T = TypeVar("T")

CHUNK = 32 * 1024
QUEUE = 8  # chunks in flight between the command's pipes and the caller
# Once the command has exited, how long output still in its pipes is waited for: a background child
# that kept them open must not hold the answer hostage.
DRAIN_GRACE_S = 0.5
# After its timeout's SIGKILL, how long the command is given to die before the answer goes without it.
KILL_GRACE_S = 5.0
KILLED_BY_SIGKILL = 128 + signal.SIGKILL
OOM_NOTE = "killed by the out-of-memory killer: the sandbox reached its memory limit while the command ran"

Stream = Literal["stdout", "stderr"]


def oom_verdict(result: ExecResult, oom_kills_before: int, oom_kills_after: int) -> ExecResult:
    """Mark a command the out-of-memory killer ended: it died of SIGKILL (not at its timeout) while
    the sandbox's count of OOM kills grew. A kill counted in the sandbox is every process's, so one of
    two commands running at once may be named for the other's kill; never one that was not SIGKILLed."""
    if result.timed_out or result.exit_code != KILLED_BY_SIGKILL or oom_kills_after <= oom_kills_before:
        return result
    note = OOM_NOTE if not result.note else f"{OOM_NOTE}; {result.note}"
    return result.model_copy(update={"oom_killed": True, "note": note})


class ExecEvents(Protocol):
    """A streamed command as every hop holds it: here (:class:`ExecStream`), from an agent over HTTP,
    or through a replica's bounds."""

    def events(self) -> AsyncIterator[ExecEvent | None]: ...

    async def aclose(self) -> None: ...


class ExecStream:
    """One streamed command. ``events`` yields its output as it comes, ``None`` for a keepalive while
    it is silent, and last its :class:`ExecResult`; ``aclose`` kills it if it is still running (a
    caller gone) and hands its slot back. ``oom_kills`` reads the sandbox's OOM-kill count."""

    def __init__(
        self,
        spawned: Spawned,
        timeout_s: float,
        *,
        oom_kills: Callable[[], Awaitable[int]],
        oom_kills_before: int,
        release: Callable[[], None],
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        self._spawned = spawned
        self._timeout_s = timeout_s
        self._oom_kills = oom_kills
        self._oom_before = oom_kills_before
        self._release: Callable[[], None] | None = release
        self._keepalive_s = keepalive_s
        self._started = time.monotonic()
        self._exit_code: int | None = None
        self._killed = False
        self._tasks: list[asyncio.Task[None]] = []

    async def events(self) -> AsyncIterator[ExecEvent | None]:
        queue: asyncio.Queue[tuple[str, str | int]] = asyncio.Queue(QUEUE)
        self._tasks = [
            asyncio.create_task(self._pump(self._spawned.stdout, "stdout", queue)),
            asyncio.create_task(self._pump(self._spawned.stderr, "stderr", queue)),
            asyncio.create_task(self._wait(queue)),
        ]
        open_streams = {"stdout", "stderr"}
        exited = timed_out = False
        # Until the command's timeout; then until its kill has taken; then, once it has exited, until
        # its pipes fall silent for DRAIN_GRACE_S, and never past ``hard_end``: a background child that
        # keeps them open and writing does not hold the answer hostage.
        phase_ends = self._started + self._timeout_s
        hard_end = phase_ends + KILL_GRACE_S + DRAIN_GRACE_S
        while open_streams or not exited:
            now = time.monotonic()
            if not exited and now >= phase_ends:  # checked on every turn: a chatty command too
                if timed_out:
                    break  # not dead yet (a frozen sandbox): it dies of its SIGKILL when it thaws
                timed_out = self._killed = True
                self._spawned.signal(signal.SIGKILL)
                phase_ends = now + KILL_GRACE_S
                continue
            if exited and now >= phase_ends and (queue.empty() or now >= hard_end):
                break
            if not queue.empty():
                kind, value = queue.get_nowait()
            else:
                try:
                    kind, value = await asyncio.wait_for(
                        queue.get(), min(self._keepalive_s, max(phase_ends - now, 0.0))
                    )
                except TimeoutError:
                    if time.monotonic() < phase_ends:
                        yield None  # silent for a keepalive's length
                    continue
            if kind == "exit":
                exited = True
                phase_ends = time.monotonic() + DRAIN_GRACE_S
            elif kind == "eof":
                open_streams.discard(str(value))
            elif isinstance(value, str) and value:
                if exited:
                    phase_ends = min(time.monotonic() + DRAIN_GRACE_S, hard_end)
                yield ExecOutput(stream="stdout" if kind == "stdout" else "stderr", text=value)
        result = ExecResult(
            exit_code=KILLED_BY_SIGKILL if self._exit_code is None else self._exit_code,
            duration_ms=(time.monotonic() - self._started) * 1000.0,
            timed_out=timed_out,
        )
        await self.aclose()
        yield oom_verdict(result, self._oom_before, await self._oom_kills())

    async def _pump(
        self, reader: asyncio.StreamReader, name: Stream, queue: asyncio.Queue[tuple[str, str | int]]
    ) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := await reader.read(CHUNK):
            await queue.put((name, decoder.decode(chunk)))
        await queue.put((name, decoder.decode(b"", final=True)))
        await queue.put(("eof", name))

    async def _wait(self, queue: asyncio.Queue[tuple[str, str | int]]) -> None:
        self._exit_code = await self._spawned.wait()
        await queue.put(("exit", self._exit_code))

    async def aclose(self) -> None:
        """Idempotent. A command still running is killed (with everything it started) and reaped."""
        for task in self._tasks:
            task.cancel()
        try:
            if self._exit_code is None and not self._killed:
                self._killed = True
                self._spawned.signal(signal.SIGKILL)
                with contextlib.suppress(TimeoutError):
                    self._exit_code = await asyncio.wait_for(self._spawned.wait(), KILL_GRACE_S)
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class CallerGone(ClientDisconnect):
    """The caller of a unary exec went away before its answer; its command was killed. Answered as
    any client that disconnected is (quietly: nobody reads it)."""


async def unless_caller_goes(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` (a unary exec) while watching the caller's connection: if it closes first, the
    work is cancelled, and with it the command (the runtime kills what it started when cancelled), so a
    client that gave up never leaves its command running until its timeout."""
    task = asyncio.ensure_future(work)

    async def gone() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watch = asyncio.ensure_future(gone())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        watch.cancel()
        task.cancel()
        raise
    watch.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
        raise CallerGone()
    return task.result()


class ExecResponse(StreamingResponse):
    """A streamed command as an HTTP answer, one event a line. However the answer ends (its end, an
    error, or its caller gone while it was blocked on a write, which leaves the body's generator
    suspended and its ``finally`` never run) the command is closed: killed if it still runs."""

    media_type = STREAM_MEDIA_TYPE

    def __init__(self, stream: ExecEvents) -> None:
        super().__init__(_lines(stream), media_type=STREAM_MEDIA_TYPE)
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._stream.aclose()


async def _lines(stream: ExecEvents) -> AsyncIterator[bytes]:
    try:
        async for event in stream.events():
            yield encode_event(event)
    except Exception as exc:  # the answer has begun: an error can only be its last line
        log.exception("streamed exec failed")
        yield encode_event(
            ExecStreamError(code=ErrorCode.INTERNAL, message=f"the command's stream failed: {exc!r}")
        )
