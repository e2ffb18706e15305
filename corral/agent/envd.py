"""The agent's data plane: the envd protocol (processes, files) for the sandboxes of this host.

Every request names its sandbox in ``E2b-Sandbox-Id``; whoever routed it here has already decided the
caller may reach that sandbox. Everything runs in the sandbox, as its one user, through the runtime's
``spawn`` (the launcher): a command as given; a file operation as :mod:`corral.agent.envd_helper`, a
small program run in the sandbox, so a path can only ever name the sandbox's own files.

Bounds: a request message is at most ``MAX_MESSAGE_BYTES``; an upload or a download at most
``files_max_bytes``, and an upload that sends nothing for ``idle_timeout_s`` is dropped; a streamed
command's output waits in a short queue, so a reader that does not read stops the command's output
(backpressure) instead of growing memory. A command whose stream is closed keeps running, its output
discarded, until it ends or the sandbox does (``Connect`` reattaches); but at most ``UNHEARD_BYTES``
of its output are read while nobody listens (reading is the host's CPU, outside every sandbox's
limit): past that its pipes are left full, so the command blocks on its next write, costing nothing,
until a client attaches again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, Router
from starlette.types import Receive, Scope, Send

from corral.agent.agent import Agent
from corral.agent.connect import (
    STREAM_CONTENT_TYPE,
    RpcBusy,
    RpcError,
    end_stream,
    envelope,
    parse_json,
    unwrap,
)
from corral.agent.errors import AgentBusy, AgentError
from corral.runtime.base import InvalidSandbox, RuntimeFailure, SandboxNotFound, SandboxPaused
from corral.runtime.bwrap import SANDBOX_USER
from corral.runtime.capture import close_reader
from corral.runtime.stream import Spawned

SANDBOX_HEADER = "e2b-sandbox-id"
ENVD_PREFIX = "/envd"  # where an agent's HTTP API serves this
# A relayed call's own Authorization (it names the sandbox user), moved aside for the agent's token.
CALLER_AUTH_HEADER = "corral-caller-authorization"
# The envd protocol level served: the SDK sends no user below 0.4.0 assumptions and uploads
# file-like data as octet-stream from 0.5.7.
ENVD_VERSION = "0.5.7"
MAX_MESSAGE_BYTES = 1024 * 1024
MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a file operation's answer (a deep listing)
FILES_MAX_BYTES = 256 * 1024 * 1024
IDLE_TIMEOUT_S = 30.0
MAX_PROCESSES = 256  # tracked per sandbox
_CHUNK = 32 * 1024
_QUEUE = 8  # output chunks in flight per stream
# Output a command may write while no client listens, per detached spell, read and dropped; then
# reading stops until a client attaches (Connect).
UNHEARD_BYTES = 1024 * 1024
_KEEPALIVE_DEFAULT_S = 50.0
_ABANDON_GRACE_S = 2.0
_HELPER = Path(__file__).with_name("envd_helper.py").read_text()
_SIGNALS = {
    "SIGNAL_SIGKILL": signal.SIGKILL,
    "SIGNAL_SIGTERM": signal.SIGTERM,
    9: signal.SIGKILL,
    15: signal.SIGTERM,
}


def helper_command(request: dict[str, Any]) -> list[str]:
    return ["python3", "-I", "-c", _HELPER, json.dumps(request)]


@dataclass(eq=False)
class _Run:
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
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue(_QUEUE)
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


class Envd:
    def __init__(
        self,
        agent: Agent,
        *,
        files_max_bytes: int = FILES_MAX_BYTES,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self.agent = agent
        self.files_max_bytes = files_max_bytes
        self.idle_timeout_s = idle_timeout_s
        self._runs: dict[str, dict[int, _Run]] = {}
        self._slots: set[asyncio.Task[None]] = set()  # each hands a command's slot back as it exits
        self._next_pid: dict[str, int] = {}
        # Every byte read from a streamed command's output, heard or not: what draining cost the host.
        self.output_bytes_read = 0
        rpc = self._rpc
        self.app = Router(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/files", self.download, methods=["GET"]),
                Route("/files", self.upload, methods=["POST"]),
                Route("/process.Process/Start", self.start, methods=["POST"]),
                Route("/process.Process/Connect", self.connect, methods=["POST"]),
                Route("/process.Process/List", rpc(self.list_processes), methods=["POST"]),
                Route("/process.Process/SendSignal", rpc(self.send_signal), methods=["POST"]),
                Route("/process.Process/SendInput", rpc(self.send_input), methods=["POST"]),
                Route("/process.Process/CloseStdin", rpc(self.close_stdin), methods=["POST"]),
                *(
                    Route(f"/filesystem.Filesystem/{name}", rpc(self._fs(op)), methods=["POST"])
                    for name, op in (
                        ("Stat", "stat"),
                        ("ListDir", "list"),
                        ("MakeDir", "mkdir"),
                        ("Move", "move"),
                        ("Remove", "remove"),
                    )
                ),
            ]
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)

    # -- plumbing ---------------------------------------------------------------------------------

    def _sandbox(self, request: Request) -> str:
        sandbox_id = request.headers.get(SANDBOX_HEADER, "")
        try:
            self.agent.get(sandbox_id)
        except AgentError:
            raise RpcError("not_found", f"sandbox {sandbox_id} was not found") from None
        user = _basic_user(
            request.headers.get(CALLER_AUTH_HEADER) or request.headers.get("authorization", "")
        )
        for name in (user, request.query_params.get("username")):
            if name and name != SANDBOX_USER:
                raise RpcError(
                    "permission_denied", f"a corral sandbox has one user, {SANDBOX_USER!r}; not {name!r}"
                )
        return sandbox_id

    async def _message(self, request: Request, limit: int = MAX_MESSAGE_BYTES) -> bytes:
        body = bytearray()
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RpcError("resource_exhausted", f"the request is larger than {limit} bytes")
        return bytes(body)

    def _rpc(
        self, handler: Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                sandbox_id = self._sandbox(request)
                result = await handler(sandbox_id, parse_json(await self._message(request)))
            except RpcError as exc:
                return _unary_error(exc)
            except ClientDisconnect:
                return Response(status_code=499)
            return JSONResponse(result)

        return endpoint

    async def _spawn(
        self,
        sandbox_id: str,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> Spawned:
        """Every command of this data plane starts here, holding one of the sandbox's command slots
        (the agent's bound, shared with exec) until it exits."""
        try:
            self.agent.enter(sandbox_id)
        except AgentBusy as exc:
            raise RpcBusy(exc.message, exc.retry_after_s) from None
        try:
            spawned = await self._spawn_in(sandbox_id, command, env=env, cwd=cwd, stdin=stdin)
        except BaseException:
            self.agent.leave(sandbox_id)
            raise
        task = asyncio.get_running_loop().create_task(self._leave_at_exit(sandbox_id, spawned))
        self._slots.add(task)
        task.add_done_callback(self._slots.discard)
        return spawned

    async def _leave_at_exit(self, sandbox_id: str, spawned: Spawned) -> None:
        try:
            await spawned.wait()
        finally:
            self.agent.leave(sandbox_id)

    async def _spawn_in(
        self,
        sandbox_id: str,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> Spawned:
        try:
            return await self.agent.runtime.spawn(sandbox_id, command, env=env, cwd=cwd, stdin=stdin)
        except SandboxNotFound:
            raise RpcError("not_found", f"sandbox {sandbox_id} was not found") from None
        except SandboxPaused as exc:
            raise RpcError("failed_precondition", str(exc)) from None
        except InvalidSandbox as exc:
            raise RpcError("invalid_argument", f"{exc.field}: {exc}") from None
        except RuntimeFailure as exc:
            raise RpcError("unavailable", str(exc)) from None

    # -- health -----------------------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        try:
            self._sandbox(request)
        except RpcError as exc:
            return JSONResponse({"code": 502, "message": exc.message}, status_code=502)
        return Response(status_code=204)

    # -- processes --------------------------------------------------------------------------------

    async def start(self, request: Request) -> Response:
        try:
            sandbox_id = self._sandbox(request)
            req = unwrap(await self._message(request))
            run = await self._start(sandbox_id, req)
        except RpcError as exc:
            return _stream_error(exc)
        return self._stream(request, run)

    async def _start(self, sandbox_id: str, req: dict[str, Any]) -> _Run:
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
        if req.get("pty"):
            raise RpcError("unimplemented", "terminals (pty) are not supported")
        tag = req.get("tag") if isinstance(req.get("tag"), str) else None
        runs = self._runs.setdefault(sandbox_id, {})
        if len(runs) >= MAX_PROCESSES:
            raise RpcError("resource_exhausted", f"at most {MAX_PROCESSES} commands run at once")
        spawned = await self._spawn(
            sandbox_id, [process["cmd"], *args], env=envs, cwd=cwd, stdin=bool(req.get("stdin"))
        )
        pid = self._next_pid.get(sandbox_id, 1)
        self._next_pid[sandbox_id] = pid + 1
        config = {"cmd": process["cmd"], "args": args, "envs": envs, **({"cwd": cwd} if cwd else {})}
        run = _Run(pid, config, tag, spawned)
        runs[pid] = run
        run.attach()
        run.tasks = [
            asyncio.create_task(self._pump(run, spawned.stdout, "stdout")),
            asyncio.create_task(self._pump(run, spawned.stderr, "stderr")),
        ]
        run.tasks.append(asyncio.create_task(self._finish(sandbox_id, run)))
        return run

    async def _pump(self, run: _Run, stream: asyncio.StreamReader, name: str) -> None:
        while await run.may_read():
            chunk = await stream.read(_CHUNK)
            if not chunk:
                return
            self.output_bytes_read += len(chunk)
            await run.emit((name, chunk))
        close_reader(stream)  # ended unheard: a child that kept the pipe gets EPIPE, not a drain

    async def _finish(self, sandbox_id: str, run: _Run) -> None:
        code = await run.spawned.wait()
        run.exit()
        await asyncio.gather(*run.tasks[:2], return_exceptions=True)
        run.exit_code = code
        await run.emit(("end", code))
        run.ended.set()
        self._runs.get(sandbox_id, {}).pop(run.pid, None)
        if sandbox_id not in self.agent.sandbox_ids():  # the sandbox is gone: forget it wholly
            self._runs.pop(sandbox_id, None)
            self._next_pid.pop(sandbox_id, None)

    def _stream(self, request: Request, run: _Run) -> Response:
        queue = run.listener
        assert queue is not None
        deadline = _deadline(request.headers.get("connect-timeout-ms"))
        keepalive = _keepalive(request.headers.get("keepalive-ping-interval"))

        async def events() -> AsyncIterator[bytes]:
            try:
                yield envelope({"event": {"start": {"pid": run.pid}}})
                if run.exit_code is not None and queue.empty():
                    yield envelope({"event": _end(run.exit_code)})
                    yield end_stream()
                    return
                while True:
                    wait = keepalive if deadline is None else min(keepalive, deadline - time.monotonic())
                    if wait <= 0:
                        yield end_stream(RpcError("deadline_exceeded", "the stream's deadline passed"))
                        return
                    try:
                        kind, value = await asyncio.wait_for(queue.get(), wait)
                    except TimeoutError:
                        yield envelope({"event": {"keepalive": {}}})
                        continue
                    if kind == "end":
                        yield envelope({"event": _end(value)})
                        break
                    data = base64.b64encode(value).decode()
                    yield envelope({"event": {"data": {kind: data}}})
                yield end_stream()
            finally:
                run.detach(queue)  # the command runs on; its output now goes nowhere

        return _Detaching(events(), lambda: run.detach(queue))

    def _find(self, sandbox_id: str, selector: Any) -> _Run:
        runs = self._runs.get(sandbox_id, {})
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
            sandbox_id = self._sandbox(request)
            req = unwrap(await self._message(request))
            run = self._find(sandbox_id, req.get("process"))
        except RpcError as exc:
            return _stream_error(exc)
        run.attach()
        return self._stream(request, run)

    async def list_processes(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        return {
            "processes": [
                {"config": r.config, "pid": r.pid, **({"tag": r.tag} if r.tag else {})}
                for r in self._runs.get(sandbox_id, {}).values()
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
        data = (req.get("input") or {}).get("stdin")
        if run.spawned.stdin is None:
            raise RpcError("failed_precondition", "the process was started without stdin")
        try:
            run.spawned.stdin.write(base64.b64decode(data or "", validate=True))
            await run.spawned.stdin.drain()
        except (binascii.Error, TypeError):
            raise RpcError("invalid_argument", "input.stdin must be base64") from None
        except (BrokenPipeError, ConnectionResetError):
            raise RpcError("failed_precondition", "the process no longer reads its stdin") from None
        return {}

    async def close_stdin(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        run = self._find(sandbox_id, req.get("process"))
        if run.spawned.stdin is not None:
            run.spawned.stdin.close()
        return {}

    # -- files ------------------------------------------------------------------------------------

    async def _helper(self, sandbox_id: str, request: dict[str, Any]) -> dict[str, Any]:
        spawned = await self._spawn(sandbox_id, helper_command(request))
        try:
            out, err = await asyncio.gather(
                _read_all(spawned.stdout, MAX_ANSWER_BYTES), _read_all(spawned.stderr, MAX_MESSAGE_BYTES)
            )
        except BaseException:
            spawned.signal(signal.SIGKILL)
            await spawned.wait()
            raise
        code = await spawned.wait()
        if code != 0:
            raise _helper_error(err, code)
        return parse_json(out)

    def _fs(self, op: str) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
        async def handler(sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
            return await self._helper(sandbox_id, {**req, "op": op})

        return handler

    async def download(self, request: Request) -> Response:
        try:
            sandbox_id = self._sandbox(request)
            spawned = await self._spawn(
                sandbox_id, helper_command({"op": "read", "path": request.query_params.get("path", "")})
            )
        except RpcError as exc:
            return _files_error(exc)
        first = await spawned.stdout.read(1)
        if first != b"\0":
            err = await spawned.stderr.read()
            return _files_error(_helper_error(err, await spawned.wait()))
        limit = self.files_max_bytes

        async def body() -> AsyncIterator[bytes]:
            sent = 0
            try:
                while chunk := await spawned.stdout.read(_CHUNK):
                    sent += len(chunk)
                    if sent > limit:
                        raise RuntimeError(f"the file is larger than {limit} bytes")  # cuts the response
                    yield chunk
                await spawned.wait()
            finally:
                spawned.signal(signal.SIGKILL)

        return StreamingResponse(body(), media_type="application/octet-stream")

    async def upload(self, request: Request) -> Response:
        try:
            sandbox_id = self._sandbox(request)
            content_type, options = parse_options_header(request.headers.get("content-type", ""))
            if content_type == b"multipart/form-data":
                written = await self._upload_multipart(sandbox_id, request, options.get(b"boundary", b""))
            else:
                path = request.query_params.get("path", "")
                written = await self._write(sandbox_id, path, _iterate(request.stream()))
        except RpcError as exc:
            return _files_error(exc)
        except ClientDisconnect:
            return Response(status_code=499)
        return JSONResponse(written)

    async def _patient(self, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``chunks`` as they come, ended with an error once the sender stalls for the idle timeout."""
        while True:
            try:
                chunk = await asyncio.wait_for(anext(chunks), self.idle_timeout_s)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise RpcError(
                    "deadline_exceeded", f"the upload sent nothing for {self.idle_timeout_s:g} s"
                ) from None
            yield chunk

    async def _write(self, sandbox_id: str, path: str, chunks: AsyncIterator[bytes]) -> list[dict[str, Any]]:
        if not path:
            raise RpcError("invalid_argument", "path is required")
        spawned = await self._spawn(sandbox_id, helper_command({"op": "write", "path": path}), stdin=True)
        assert spawned.stdin is not None
        total = 0
        try:
            async for chunk in self._patient(chunks):
                total += len(chunk)
                if total > self.files_max_bytes:
                    raise RpcError(
                        "resource_exhausted", f"the file is larger than {self.files_max_bytes} bytes"
                    )
                spawned.stdin.write(chunk)
                await spawned.stdin.drain()
            spawned.stdin.close()
            out, err = await asyncio.gather(spawned.stdout.read(), spawned.stderr.read())
            code = await spawned.wait()
        except BaseException:
            await asyncio.shield(_abandon(spawned))
            raise
        if code != 0:
            raise _helper_error(err, code)
        result: list[dict[str, Any]] = json.loads(out)
        return result

    async def _upload_multipart(
        self, sandbox_id: str, request: Request, boundary: bytes
    ) -> list[dict[str, Any]]:
        """Each ``file`` part streamed to its file as it arrives (never held whole in memory)."""
        if not boundary:
            raise RpcError("invalid_argument", "multipart body without a boundary")
        default_path = request.query_params.get("path")
        parts: asyncio.Queue[bytes | None] = asyncio.Queue(_QUEUE)
        written: list[dict[str, Any]] = []
        current: list[asyncio.Task[list[dict[str, Any]]]] = []
        headers: dict[bytes, bytes] = {}
        field_name: list[bytes] = []
        pending: list[tuple[str, bytes]] = []

        def on_header_field(data: bytes, start: int, end: int) -> None:
            field_name.append(data[start:end])

        def on_header_value(data: bytes, start: int, end: int) -> None:
            headers[b"".join(field_name).lower()] = (
                headers.get(b"".join(field_name).lower(), b"") + data[start:end]
            )
            field_name.clear()

        def on_part_begin() -> None:
            headers.clear()

        def on_headers_finished() -> None:
            _, opts = parse_options_header(headers.get(b"content-disposition", b""))
            filename = opts.get(b"filename", b"").decode(errors="replace")
            pending.append(("begin", (default_path or filename).encode()))

        def on_part_data(data: bytes, start: int, end: int) -> None:
            pending.append(("data", data[start:end]))

        def on_part_end() -> None:
            pending.append(("end", b""))

        parser = MultipartParser(
            boundary,
            {
                "on_part_begin": on_part_begin,
                "on_header_field": on_header_field,
                "on_header_value": on_header_value,
                "on_headers_finished": on_headers_finished,
                "on_part_data": on_part_data,
                "on_part_end": on_part_end,
            },
        )

        async def part_chunks() -> AsyncIterator[bytes]:
            while (chunk := await parts.get()) is not None:
                yield chunk

        stream = request.stream()
        try:
            async for chunk in self._patient(stream):
                parser.write(chunk)
                for kind, value in pending:
                    if kind == "begin":
                        current.append(
                            asyncio.create_task(self._write(sandbox_id, value.decode(), part_chunks()))
                        )
                    elif kind == "data" and current and value:
                        await _put_or_fail(parts, value, current[-1])
                    elif kind == "end" and current:
                        await _put_or_fail(parts, None, current[-1])
                        written += await current.pop()
                pending.clear()
            parser.finalize()
        finally:
            for task in current:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        if not written:
            raise RpcError("invalid_argument", "the multipart body holds no file")
        return written


class _Detaching(StreamingResponse):
    """A command's stream that lets go of the command however the response ends: a client gone
    while its stream was blocked leaves the generator suspended, its ``finally`` never run."""

    def __init__(self, content: AsyncIterator[bytes], detach: Callable[[], None]) -> None:
        super().__init__(content, media_type=STREAM_CONTENT_TYPE)
        self._detach = detach

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._detach()


async def _read_all(stream: asyncio.StreamReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := await stream.read(_CHUNK):
        data += chunk
        if len(data) > limit:
            raise RpcError("resource_exhausted", f"the answer is larger than {limit} bytes")
    return bytes(data)


async def _abandon(spawned: Spawned) -> None:
    """End a file operation cut short: SIGTERM lets the helper remove what it half wrote."""
    spawned.signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(spawned.wait(), _ABANDON_GRACE_S)
    except TimeoutError:
        spawned.signal(signal.SIGKILL)
        await spawned.wait()


async def _put_or_fail(
    queue: asyncio.Queue[bytes | None], item: bytes | None, writer: asyncio.Task[Any]
) -> None:
    """Hand a chunk to the part's writer, unless it has already failed (then raise its error)."""
    put = asyncio.create_task(queue.put(item))
    await asyncio.wait({put, writer}, return_when=asyncio.FIRST_COMPLETED)
    if not put.done():
        put.cancel()
        writer.result()  # raises the writer's error
        raise RpcError("internal", "the upload ended early")


async def _iterate(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in stream:
        if chunk:
            yield chunk


def _basic_user(header: str) -> str | None:
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        return base64.b64decode(value.strip(), validate=True).decode().partition(":")[0] or None
    except (binascii.Error, UnicodeDecodeError):
        return None


def _helper_error(err: bytes, code: int) -> RpcError:
    try:
        body = json.loads(err)
        return RpcError(str(body["code"]), str(body["message"]))
    except (ValueError, KeyError, TypeError):
        text = err.decode(errors="replace").strip()
        return RpcError("internal", f"file operation failed (exit {code}): {text[-500:]}")


def _end(code: int) -> dict[str, Any]:
    status = f"exit status {code}"
    if code > 128:
        with contextlib.suppress(ValueError):
            status = f"signal: {signal.Signals(code - 128).name}"
    return {"end": {"exitCode": code, "exited": code < 128, "status": status}}


def _deadline(header: str | None) -> float | None:
    try:
        return time.monotonic() + int(header or "") / 1000.0
    except ValueError:
        return None


def _keepalive(header: str | None) -> float:
    try:
        return max(1.0, min(float(header or _KEEPALIVE_DEFAULT_S), 300.0))
    except ValueError:
        return _KEEPALIVE_DEFAULT_S


def _stream_error(exc: RpcError) -> Response:
    # A stream's errors travel in its end envelope, under HTTP 200.
    return Response(end_stream(exc), media_type=STREAM_CONTENT_TYPE)


def _unary_error(exc: RpcError) -> Response:
    headers = exc.headers() if isinstance(exc, RpcBusy) else None
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _files_error(exc: RpcError) -> Response:
    if isinstance(exc, RpcBusy):
        return JSONResponse({"code": 429, "message": exc.message}, status_code=429, headers=exc.headers())
    status = {
        "not_found": 404,
        "invalid_argument": 400,
        "permission_denied": 403,
        "deadline_exceeded": 408,
        "failed_precondition": 409,  # a paused sandbox: its state, not the request, is in the way
    }.get(exc.code, exc.status)
    if exc.code == "resource_exhausted":
        status = 413 if "larger" in exc.message else 507
    return JSONResponse({"code": status, "message": exc.message}, status_code=status)
