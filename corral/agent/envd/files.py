"""The data plane's files service (``filesystem.Filesystem`` and ``/files``): every operation runs in the
sandbox, as its one user, as a command started through the runtime's ``spawn`` (the launcher's ``fs``
mode, or :mod:`corral.agent.envd.helper`: see :mod:`corral.agent.envd.fscommand`), so a path can only
ever name the sandbox's own files.

Bounds: an upload or a download is at most ``files_max_bytes``, and an upload that sends nothing for
``idle_timeout_s`` is dropped; an operation's answer is at most ``MAX_ANSWER_BYTES``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from python_multipart import MultipartParser
from python_multipart.multipart import parse_options_header
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from corral.agent.envd.calls import CHUNK, MAX_MESSAGE_BYTES, QUEUE, Calls
from corral.agent.envd.connect import JsonAnswer, RpcBusy, RpcError, parse_json
from corral.agent.envd.fscommand import fs_command
from corral.runtime.stream import Spawned

MAX_ANSWER_BYTES = 16 * 1024 * 1024  # a file operation's answer (a deep listing)
FILES_MAX_BYTES = 256 * 1024 * 1024
IDLE_TIMEOUT_S = 30.0
_ABANDON_GRACE_S = 2.0
EXIT_NOT_FOUND = 127  # as a shell says a command is not there (the launcher's too)


class Files:
    def __init__(
        self, calls: Calls, files_max_bytes: int = FILES_MAX_BYTES, idle_timeout_s: float = IDLE_TIMEOUT_S
    ) -> None:
        self.calls = calls
        self.files_max_bytes = files_max_bytes
        self.idle_timeout_s = idle_timeout_s

    def routes(self) -> list[Route]:
        rpc = self.calls.rpc
        return [
            Route("/files", self.download, methods=["GET"]),
            Route("/files", self.upload, methods=["POST"]),
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

    async def _command(self, sandbox_id: str, request: dict[str, Any]) -> list[str]:
        return await fs_command(self.calls.agent.runtime, sandbox_id, request, MAX_ANSWER_BYTES)

    async def _helper(self, sandbox_id: str, request: dict[str, Any]) -> dict[str, Any]:
        spawned = await self.calls.spawn(sandbox_id, await self._command(sandbox_id, request))
        try:
            out, err = await asyncio.gather(
                read_all(spawned.stdout, MAX_ANSWER_BYTES), read_all(spawned.stderr, MAX_MESSAGE_BYTES)
            )
        except BaseException:
            spawned.signal(signal.SIGKILL)
            await spawned.wait()
            raise
        code = await spawned.wait()
        if code != 0:
            raise helper_error(err, code)
        return parse_json(out)

    def _fs(self, op: str) -> Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]:
        async def handler(sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
            return await self._helper(sandbox_id, {**req, "op": op})

        return handler

    async def download(self, request: Request) -> Response:
        try:
            sandbox_id = self.calls.sandbox(request)
            read = {"op": "read", "path": request.query_params.get("path", "")}
            spawned = await self.calls.spawn(sandbox_id, await self._command(sandbox_id, read))
        except RpcError as exc:
            return _files_error(exc)
        first = await spawned.stdout.read(1)
        if first != b"\0":
            err = await spawned.stderr.read()
            return _files_error(helper_error(err, await spawned.wait()))
        limit = self.files_max_bytes

        async def body() -> AsyncIterator[bytes]:
            sent = 0
            try:
                while chunk := await spawned.stdout.read(CHUNK):
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
            sandbox_id = self.calls.sandbox(request)
            content_type, options = parse_options_header(request.headers.get("content-type", ""))
            if content_type == b"multipart/form-data":
                written = await self._upload_multipart(sandbox_id, request, options.get(b"boundary", b""))
            else:
                path = request.query_params.get("path", "")
                chunks = _decoded(_iterate(request.stream()), request.headers.get("content-encoding"))
                written = await self._write(sandbox_id, path, chunks)
        except RpcError as exc:
            return _files_error(exc)
        except ClientDisconnect:
            return Response(status_code=499)
        return JsonAnswer(written)

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
        spawned = await self.calls.spawn(
            sandbox_id, await self._command(sandbox_id, {"op": "write", "path": path}), stdin=True
        )
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
            raise helper_error(err, code)
        result: list[dict[str, Any]] = json.loads(out)
        return result

    async def _upload_multipart(
        self, sandbox_id: str, request: Request, boundary: bytes
    ) -> list[dict[str, Any]]:
        """Each ``file`` part streamed to its file as it arrives (never held whole in memory)."""
        if not boundary:
            raise RpcError("invalid_argument", "multipart body without a boundary")
        default_path = request.query_params.get("path")
        parts: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE)
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


async def read_all(stream: asyncio.StreamReader, limit: int) -> bytes:
    data = bytearray()
    while chunk := await stream.read(CHUNK):
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


def _decoded(chunks: AsyncIterator[bytes], encoding: str | None) -> AsyncIterator[bytes]:
    """An upload's body as the file's bytes: ``Content-Encoding: gzip`` is undone as it streams."""
    name = (encoding or "identity").strip().lower()
    if name == "identity":
        return chunks
    if name not in ("gzip", "x-gzip"):
        raise RpcError("invalid_argument", f"Content-Encoding {encoding!r} is not accepted (gzip is)")
    return _gunzip(chunks)


async def _gunzip(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    # Inflated CHUNK bytes at a time: a small body that inflates hugely never sits in memory whole
    # (the writer's bound on the file's size ends it).
    inflater = zlib.decompressobj(wbits=31)
    try:
        async for chunk in chunks:
            data = chunk
            while data:
                out = inflater.decompress(data, CHUNK)
                data = inflater.unconsumed_tail
                if out:
                    yield out
                if inflater.eof:
                    break
        if not inflater.eof:
            raise RpcError("invalid_argument", "the gzip body ends early")
    except zlib.error as exc:
        raise RpcError("invalid_argument", f"the body is not valid gzip: {exc}") from None


async def _iterate(stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    async for chunk in stream:
        if chunk:
            yield chunk


def helper_error(err: bytes, code: int) -> RpcError:
    try:
        body = json.loads(err)
        return RpcError(str(body["code"]), str(body["message"]))
    except (ValueError, KeyError, TypeError):
        text = err.decode(errors="replace").strip()
        if code == EXIT_NOT_FOUND:  # the program itself: the helper's python3
            return RpcError(
                "failed_precondition",
                f"this sandbox cannot run the file operation (its image has no python3?): {text[-200:]}",
            )
        return RpcError("internal", f"file operation failed (exit {code}): {text[-500:]}")


def _files_error(exc: RpcError) -> Response:
    if isinstance(exc, RpcBusy):
        return JsonAnswer({"code": 429, "message": exc.message}, status_code=429, headers=exc.headers())
    status = {
        "not_found": 404,
        "invalid_argument": 400,
        "permission_denied": 403,
        "deadline_exceeded": 408,
        "failed_precondition": 409,  # a paused sandbox: its state, not the request, is in the way
    }.get(exc.code, exc.status)
    if exc.code == "resource_exhausted":
        status = 413 if "larger" in exc.message else 507
    return JsonAnswer({"code": status, "message": exc.message}, status_code=status)
