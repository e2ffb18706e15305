"""The data plane's processes service (``process.Process``): a command started in the sandbox, its
output streamed back, reattached to, signalled and fed input.

A streamed command's output waits in a short queue, so a reader that does not read stops the command's
output (backpressure) instead of growing memory. A command whose stream is closed keeps running, its
output discarded, until it ends or the sandbox does (``Connect`` reattaches); but at most
``UNHEARD_BYTES`` of its output are read while nobody listens (reading is the host's CPU, outside every
sandbox's limit): past that its pipes are left full, so the command blocks on its next write, costing
nothing, until a client attaches again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.agent.envd.calls import CHUNK, QUEUE, Calls
from corral.agent.envd.connect import (
    DetachingStream,
    RpcError,
    end_stream,
    envelope,
    keepalive_interval,
    next_or_keepalive,
    stream_deadline,
    stream_error,
    unwrap,
)
from corral.agent.execstream import oom_verdict
from corral.exec_result import ExecResult
from corral.runtime.capture import close_reader
from corral.runtime.stream import PtySize, Spawned
from corral.runtime.terminal import MAX_SIDE

MAX_PROCESSES = 256  # tracked per sandbox
# Output a command may write while no client listens, per detached spell, read and dropped; then
# reading stops until a client attaches (Connect).
UNHEARD_BYTES = 1024 * 1024
# Input (stdin or a terminal's) queued for a process that has not read it yet: past this, more is
# refused until it reads. How long a SendInput waits for the process to take what it sent.
INPUT_BACKLOG_BYTES = 256 * 1024
INPUT_WAIT_S = 2.0
PTY_DRAIN_S = 0.5  # a terminal's output still read once its command has exited
_SIGNALS = {
    "SIGNAL_SIGKILL": signal.SIGKILL,
    "SIGNAL_SIGTERM": signal.SIGTERM,
    9: signal.SIGKILL,
    15: signal.SIGTERM,
}


@dataclass(eq=False)
class Run:
    """A command started through Process/Start, while it is tracked."""

    pid: int
    config: dict[str, Any]
    tag: str | None
    spawned: Spawned
    listener: asyncio.Queue[tuple[str, Any]] | None = None
    exit_code: int | None = None
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    unheard: int = 0  # output bytes dropped since the last listener left
    oom_kills_before: int = 0  # the sandbox's OOM kills as the command started
    error: str | None = None  # why it ended, besides its own doing (E2B's end event ``error``)
    exited: bool = False
    # Set whenever a pump held back by the unheard bound may look again: a listener came, or the end.
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    async def emit(self, event: tuple[str, Any]) -> None:
        queue = self.listener
        if queue is not None:
            await queue.put(event)  # blocks while the reader is behind: backpressure
        elif event[0] != "end":
            self.unheard += len(event[1])

    async def may_read(self) -> bool:
        """Whether a pump may read on: at once while someone listens or the unheard bound is not
        reached; else once a listener attaches (True) or the command has ended (False: what is left
        in the pipe is nobody's)."""
        while self.listener is None and self.unheard >= UNHEARD_BYTES:
            if self.exited:
                return False
            self.wake.clear()
            await self.wake.wait()
        return True

    def exit(self) -> None:
        self.exited = True
        self.wake.set()

    def attach(self) -> asyncio.Queue[tuple[str, Any]]:
        self.detach()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(QUEUE)
        self.listener = queue
        self.unheard = 0
        self.wake.set()
        return queue

    def detach(self, queue: asyncio.Queue[tuple[str, Any]] | None = None) -> None:
        old = self.listener
        if old is None or (queue is not None and old is not queue):
            return
        self.listener = None
        while not old.empty():  # frees a pump blocked on the abandoned queue
            old.get_nowait()


class Processes:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.runs: dict[str, dict[int, Run]] = {}
        self._next_pid: dict[str, int] = {}
        # Every byte read from a streamed command's output, heard or not: what draining cost the host.
        self.output_bytes_read = 0

    def routes(self) -> list[Route]:
        rpc = self.calls.rpc
        return [
            Route("/process.Process/Start", self.start, methods=["POST"]),
            Route("/process.Process/Connect", self.connect, methods=["POST"]),
            Route("/process.Process/List", rpc(self.list_processes), methods=["POST"]),
            Route("/process.Process/SendSignal", rpc(self.send_signal), methods=["POST"]),
            Route("/process.Process/SendInput", rpc(self.send_input), methods=["POST"]),
            Route("/process.Process/Update", rpc(self.update), methods=["POST"]),
            Route("/process.Process/CloseStdin", rpc(self.close_stdin), methods=["POST"]),
        ]

    async def start(self, request: Request) -> Response:
        try:
            sandbox_id = self.calls.sandbox(request)
            req = unwrap(await self.calls.message(request))
            run = await self._start(sandbox_id, req)
        except RpcError as exc:
            return stream_error(exc)
        return self._stream(request, run)

    async def _start(self, sandbox_id: str, req: dict[str, Any]) -> Run:
        process = req.get("process")
        if not isinstance(process, dict) or not isinstance(process.get("cmd"), str) or not process["cmd"]:
            raise RpcError("invalid_argument", "process.cmd must be a non-empty string")
        args, envs, cwd = process.get("args") or [], process.get("envs") or {}, process.get("cwd") or None
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise RpcError("invalid_argument", "process.args must be a list of strings")
        if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
            raise RpcError("invalid_argument", "process.envs must map names to strings")
        if cwd is not None and not isinstance(cwd, str):
            raise RpcError("invalid_argument", "process.cwd must be a string")
        size = _pty_size(req["pty"]) if req.get("pty") is not None else None
        tag = req.get("tag") if isinstance(req.get("tag"), str) else None
        runs = self.runs.setdefault(sandbox_id, {})
        if len(runs) >= MAX_PROCESSES:
            raise RpcError("resource_exhausted", f"at most {MAX_PROCESSES} commands run at once")
        oom_kills_before = await self.calls.agent.oom_kills_of(sandbox_id)
        spawned = await self.calls.spawn(
            sandbox_id,
            [process["cmd"], *args],
            env=envs,
            cwd=cwd,
            stdin=size is not None or bool(req.get("stdin")),
            pty=size,
        )
        pid = self._next_pid.get(sandbox_id, 1)
        self._next_pid[sandbox_id] = pid + 1
        config = {"cmd": process["cmd"], "args": args, "envs": envs, **({"cwd": cwd} if cwd else {})}
        run = Run(pid, config, tag, spawned, oom_kills_before=oom_kills_before)
        runs[pid] = run
        run.attach()
        run.tasks = [
            # A terminal has one stream, E2B's ``pty`` output.
            asyncio.create_task(self._pump(run, spawned.stdout, "stdout" if size is None else "pty")),
            asyncio.create_task(self._pump(run, spawned.stderr, "stderr")),
        ]
        run.tasks.append(asyncio.create_task(self._finish(sandbox_id, run)))
        return run

    async def _pump(self, run: Run, stream: asyncio.StreamReader, name: str) -> None:
        while await run.may_read():
            chunk = await stream.read(CHUNK)
            if not chunk:
                return
            self.output_bytes_read += len(chunk)
            await run.emit((name, chunk))
        close_reader(stream)  # ended unheard: a child that kept the pipe gets EPIPE, not a drain

    async def _finish(self, sandbox_id: str, run: Run) -> None:
        code = await run.spawned.wait()
        run.exit()
        if run.spawned.resize is not None:
            await _hang_up(run)
        await asyncio.gather(*run.tasks[:2], return_exceptions=True)
        verdict = oom_verdict(
            ExecResult(exit_code=code), run.oom_kills_before, await self.calls.agent.oom_kills_of(sandbox_id)
        )
        if verdict.oom_killed:
            # Said where its user looks: on its stderr, and as the end's error (the SDK raises it).
            run.error = verdict.note
            await run.emit(("stderr", f"\n{verdict.note}\n".encode()))
        run.exit_code = code
        await run.emit(("end", code))
        run.ended.set()
        self.runs.get(sandbox_id, {}).pop(run.pid, None)
        if sandbox_id not in self.calls.agent.sandbox_ids():  # the sandbox is gone: forget it wholly
            self.runs.pop(sandbox_id, None)
            self._next_pid.pop(sandbox_id, None)

    def _stream(self, request: Request, run: Run) -> Response:
        queue = run.listener
        assert queue is not None
        until = stream_deadline(request.headers.get("connect-timeout-ms"))
        every = keepalive_interval(request.headers.get("keepalive-ping-interval"))

        async def events() -> AsyncIterator[bytes]:
            try:
                yield envelope({"event": {"start": {"pid": run.pid}}})
                if run.exit_code is not None and queue.empty():
                    yield envelope({"event": _end(run.exit_code, run.error)})
                    yield end_stream()
                    return
                while True:
                    try:
                        item = await next_or_keepalive(queue.get, until, every)
                    except RpcError as exc:
                        yield end_stream(exc)
                        return
                    if item is None:
                        yield envelope({"event": {"keepalive": {}}})
                        continue
                    kind, value = item
                    if kind == "end":
                        yield envelope({"event": _end(value, run.error)})
                        break
                    data = base64.b64encode(value).decode()
                    yield envelope({"event": {"data": {kind: data}}})
                yield end_stream()
            finally:
                run.detach(queue)  # the command runs on; its output now goes nowhere

        return DetachingStream(events(), lambda: run.detach(queue))

    def _find(self, sandbox_id: str, selector: Any) -> Run:
        runs = self.runs.get(sandbox_id, {})
        if isinstance(selector, dict):
            if "pid" in selector and isinstance(selector["pid"], int) and selector["pid"] in runs:
                return runs[selector["pid"]]
            if "tag" in selector:
                for run in runs.values():
                    if run.tag is not None and run.tag == selector["tag"]:
                        return run
        raise RpcError("not_found", f"process {selector!r} not found")

    async def connect(self, request: Request) -> Response:
        try:
            sandbox_id = self.calls.sandbox(request)
            req = unwrap(await self.calls.message(request))
            run = self._find(sandbox_id, req.get("process"))
        except RpcError as exc:
            return stream_error(exc)
        run.attach()
        return self._stream(request, run)

    async def list_processes(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        return {
            "processes": [
                {"config": r.config, "pid": r.pid, **({"tag": r.tag} if r.tag else {})}
                for r in self.runs.get(sandbox_id, {}).values()
                if r.exit_code is None
            ]
        }

    async def send_signal(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        sig = _SIGNALS.get(req.get("signal"))
        if sig is None:
            raise RpcError("invalid_argument", "signal must be SIGNAL_SIGKILL or SIGNAL_SIGTERM")
        self._find(sandbox_id, req.get("process")).spawned.signal(sig)
        return {}

    async def send_input(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        run = self._find(sandbox_id, req.get("process"))
        given = req.get("input") or {}
        if not given:
            return {}  # nothing to send (an empty oneof)
        if not isinstance(given, dict) or len(given) != 1 or not {"stdin", "pty"} >= given.keys():
            raise RpcError("invalid_argument", "input must hold one of stdin or pty")
        kind, data = next(iter(given.items()))
        if (kind == "pty") != (run.spawned.resize is not None):
            raise RpcError(
                "invalid_argument",
                "input.pty is for a process started with a pty; input.stdin for one without",
            )
        stdin = run.spawned.stdin
        if stdin is None:
            raise RpcError("failed_precondition", "the process was started without stdin")
        try:
            chunk = base64.b64decode(data or "", validate=True)
        except (binascii.Error, TypeError):
            raise RpcError("invalid_argument", f"input.{kind} must be base64") from None
        # What the process has not read yet is held here up to a bound, then refused: a flood of
        # input to a process that does not read costs the host that bound, no more.
        if stdin.transport.get_write_buffer_size() >= INPUT_BACKLOG_BYTES:
            raise RpcError(
                "resource_exhausted",
                f"the process is not reading its input: {INPUT_BACKLOG_BYTES} bytes already wait for it",
            )
        if stdin.is_closing():
            raise RpcError("failed_precondition", "the process no longer reads its stdin")
        stdin.write(chunk)
        # Accepted once queued; waited for a while, so a reading process has it when this returns.
        with contextlib.suppress(TimeoutError):
            try:
                await asyncio.wait_for(stdin.drain(), INPUT_WAIT_S)
            except (BrokenPipeError, ConnectionResetError):
                raise RpcError("failed_precondition", "the process no longer reads its stdin") from None
        return {}

    async def update(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        """E2B's Update: a terminal's new size (the process gets its SIGWINCH)."""
        run = self._find(sandbox_id, req.get("process"))
        if req.get("pty") is None:
            return {}
        size = _pty_size(req["pty"])
        if run.spawned.resize is None:
            raise RpcError("invalid_argument", "the process was started without a pty")
        try:
            run.spawned.resize(size)
        except OSError as exc:
            raise RpcError("failed_precondition", f"the terminal cannot be resized: {exc}") from None
        return {}

    async def close_stdin(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        run = self._find(sandbox_id, req.get("process"))
        if run.spawned.stdin is not None:
            run.spawned.stdin.close()
        return {}


async def _hang_up(run: Run) -> None:
    """A terminal's output ends with its command, as a terminal window closes with its shell: what
    it wrote is read for a short grace, then the terminal is closed (what still runs on it, a
    background job, gets its hangup), instead of the end waiting for the last process holding it."""
    _done, pending = await asyncio.wait(run.tasks[:1], timeout=PTY_DRAIN_S)
    for task in pending:
        task.cancel()
    close_reader(run.spawned.stdout)
    if run.spawned.stdin is not None:
        run.spawned.stdin.transport.abort()  # what it held unread goes too: no flush to wait for


def _end(code: int, note: str | None = None) -> dict[str, Any]:
    """The end event as E2B's envd writes it (Go's process state): a command killed by a signal ends
    with exit code -1, ``exited`` false and the signal's name as its status and error; a non-zero exit
    carries its status as the error. ``note`` says why besides (the OOM killer), after the status."""
    if code > 128:
        with contextlib.suppress(ValueError):
            name = signal.strsignal(signal.Signals(code - 128)) or ""
            status = f"signal: {name.lower()}"
            killed = f"{status}: {note}" if note else status
            return {"end": {"exitCode": -1, "exited": False, "status": status, "error": killed}}
    status = f"exit status {code}"
    said: str | None = (f"{status}: {note}" if note else status) if code else note
    return {"end": {"exitCode": code, "exited": True, "status": status, **({"error": said} if said else {})}}


def _pty_size(pty: Any) -> PtySize:
    size = pty.get("size") if isinstance(pty, dict) else None
    if not isinstance(size, dict):
        raise RpcError("invalid_argument", "pty.size must give rows and cols")
    sides = [size.get("rows"), size.get("cols")]
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 < n <= MAX_SIDE for n in sides):
        raise RpcError("invalid_argument", f"pty.size's rows and cols are whole numbers from 1 to {MAX_SIDE}")
    return PtySize(int(sides[0] or 0), int(sides[1] or 0))
