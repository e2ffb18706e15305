"""The data plane's directory watches (``filesystem.Filesystem``'s WatchDir stream, and the
CreateWatcher / GetWatcherEvents / RemoveWatcher trio the sync SDK polls with).

A watch is a ``watch`` file operation (the launcher's fs mode, or :mod:`~corral.agent.envd.helper`'s:
see :mod:`~corral.agent.envd.fscommand`), its "helper" below, running *inside* the sandbox as its user,
like every file operation: the path resolves in the sandbox's own mount namespace (a symlink pointing
out names the sandbox's file, never the host's), inotify's limits are charged to the sandbox's uid
rather than the host's root, and the same program serves the gVisor runtime, whose files live in its
Sentry where no host-side inotify could see them. Each holds one of the sandbox's command slots while
it runs.

Bounds: at most ``MAX_WATCHERS`` per sandbox; a polled watch keeps at most ``MAX_PENDING_EVENTS``
events between two polls (later ones are dropped, as inotify's own overflow drops); a streamed watch
reads no faster than its client, so a flood waits in the kernel's bounded queue. Either reads its
helper at most ``READ_BYTES_S`` (what the agent spends on a sandbox's flood of events is bounded; the
rest waits in the helper's pipe, in the sandbox's charge). A watch ends with
RemoveWatcher, its stream's end, or its sandbox's.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import secrets
import signal
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from corral.agent.commands import ReadRate
from corral.agent.envd.calls import MAX_MESSAGE_BYTES, QUEUE, Calls
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
from corral.agent.envd.files import MAX_ANSWER_BYTES, helper_error, read_all
from corral.agent.envd.fscommand import fs_command
from corral.runtime.stream import Spawned

MAX_WATCHERS = 8  # per sandbox, streamed and polled: each holds one of its 16 command slots
MAX_PENDING_EVENTS = 4096  # a polled watch's events between two polls
# A watch's events read from its helper, bytes a second (an event is about 100 bytes: some 2,500
# events a second, far past what a client polls or a person reads).
READ_BYTES_S = 256 * 1024
START_TIMEOUT_S = 30.0  # for the helper to say its watch is in place (a recursive one walks its tree)


@dataclass(eq=False)
class Watcher:
    id: str
    spawned: Spawned
    # A polled watch's events since the last poll (at most MAX_PENDING_EVENTS, ``dropped`` past
    # that); a streamed one's go through ``stream`` instead.
    pending: collections.deque[dict[str, str]] = field(default_factory=collections.deque)
    dropped: int = 0
    rate: ReadRate = field(default_factory=lambda: ReadRate(READ_BYTES_S, READ_BYTES_S))
    stream: asyncio.Queue[dict[str, str] | None] | None = None
    reader: asyncio.Task[None] | None = None
    ended: bool = False

    def stop(self) -> None:
        self.spawned.signal(signal.SIGKILL)
        if self.reader is not None and self.reader is not asyncio.current_task():
            self.reader.cancel()


class Watches:
    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.watchers: dict[str, dict[str, Watcher]] = {}
        self._opening: collections.Counter[str] = collections.Counter()  # counted before they exist

    def routes(self) -> list[Route]:
        rpc = self.calls.rpc
        return [
            Route("/filesystem.Filesystem/WatchDir", self.watch_dir, methods=["POST"]),
            Route("/filesystem.Filesystem/CreateWatcher", rpc(self.create_watcher), methods=["POST"]),
            Route("/filesystem.Filesystem/GetWatcherEvents", rpc(self.get_watcher_events), methods=["POST"]),
            Route("/filesystem.Filesystem/RemoveWatcher", rpc(self.remove_watcher), methods=["POST"]),
        ]

    async def _open(self, sandbox_id: str, req: dict[str, Any], streamed: bool) -> Watcher:
        if req.get("allow_network_mounts") or req.get("allowNetworkMounts"):
            raise RpcError("unimplemented", "corral's sandboxes have no network mounts to watch")
        path = req.get("path")
        if not isinstance(path, str) or not path:
            raise RpcError("invalid_argument", "path must be a non-empty string")
        if len(self.watchers.get(sandbox_id, {})) + self._opening[sandbox_id] >= MAX_WATCHERS:
            raise RpcError("resource_exhausted", f"at most {MAX_WATCHERS} watches per sandbox")
        request = {"op": "watch", "path": path, "recursive": bool(req.get("recursive"))}
        self._opening[sandbox_id] += 1
        try:
            command = await fs_command(self.calls.agent.runtime, sandbox_id, request, MAX_ANSWER_BYTES)
            spawned = await self.calls.spawn(sandbox_id, command)
        finally:
            self._opening[sandbox_id] -= 1
            if not self._opening[sandbox_id]:
                del self._opening[sandbox_id]
        watcher = Watcher(secrets.token_hex(8), spawned, stream=asyncio.Queue(QUEUE) if streamed else None)
        self.watchers.setdefault(sandbox_id, {})[watcher.id] = watcher
        try:
            try:
                first = await asyncio.wait_for(spawned.stdout.readuntil(b"\n"), START_TIMEOUT_S)
            except TimeoutError:
                raise RpcError("deadline_exceeded", "the watch did not start in time") from None
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                first = b""  # ended before its first line, or said something else: its error below
            if not first.startswith(b'{"start"'):
                spawned.signal(signal.SIGKILL)
                err = await read_all(spawned.stderr, MAX_MESSAGE_BYTES)
                raise helper_error(err, await spawned.wait())
        except BaseException:
            self._forget(sandbox_id, watcher)
            raise
        watcher.reader = asyncio.get_running_loop().create_task(self._read(sandbox_id, watcher))
        return watcher

    async def _read(self, sandbox_id: str, watcher: Watcher) -> None:
        """The helper's events to where its watch keeps them, until it ends (or is stopped)."""
        try:
            while True:
                await watcher.rate.allowance(1)
                try:
                    line = await watcher.spawned.stdout.readuntil(b"\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    return
                watcher.rate.spend(len(line))
                event = _event(line)
                if event is None:
                    return  # not the helper's own words: the watch is over
                if watcher.stream is not None:
                    await watcher.stream.put(event)  # blocks while the client is behind
                elif len(watcher.pending) < MAX_PENDING_EVENTS:
                    watcher.pending.append(event)
                else:
                    watcher.dropped += 1
        finally:
            watcher.ended = True
            watcher.spawned.signal(signal.SIGKILL)
            if watcher.stream is not None:
                with contextlib.suppress(asyncio.QueueFull):
                    watcher.stream.put_nowait(None)  # wakes the stream to its end
            # Its helper ended with its sandbox (or was killed in it): the watch is gone, and a poll
            # of it answers not_found from now on.
            self._forget(sandbox_id, watcher)

    def _forget(self, sandbox_id: str, watcher: Watcher) -> None:
        ours = self.watchers.get(sandbox_id, {})
        if ours.get(watcher.id) is watcher:
            del ours[watcher.id]
        if not ours:
            self.watchers.pop(sandbox_id, None)
        watcher.stop()

    def _find(self, sandbox_id: str, req: dict[str, Any]) -> Watcher:
        watcher_id = req.get("watcher_id") or req.get("watcherId")
        watcher = self.watchers.get(sandbox_id, {}).get(watcher_id) if isinstance(watcher_id, str) else None
        if watcher is None or watcher.stream is not None:
            raise RpcError("not_found", f"watcher {watcher_id!r} not found")
        return watcher

    async def watch_dir(self, request: Request) -> Response:
        try:
            sandbox_id = self.calls.sandbox(request)
            watcher = await self._open(sandbox_id, unwrap(await self.calls.message(request)), streamed=True)
        except RpcError as exc:
            return stream_error(exc)
        queue = watcher.stream
        assert queue is not None
        until = stream_deadline(request.headers.get("connect-timeout-ms"))
        every = keepalive_interval(request.headers.get("keepalive-ping-interval"))

        async def events() -> AsyncIterator[bytes]:
            yield envelope({"start": {}})
            while not (watcher.ended and queue.empty()):
                try:
                    event = await next_or_keepalive(queue.get, until, every)
                except RpcError as exc:
                    yield end_stream(exc)
                    return
                if event is not None:
                    yield envelope({"filesystem": event})
                elif not watcher.ended:
                    yield envelope({"keepalive": {}})
            yield end_stream()

        return DetachingStream(events(), lambda: self._forget(sandbox_id, watcher))

    async def create_watcher(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        watcher = await self._open(sandbox_id, req, streamed=False)
        return {"watcherId": watcher.id}

    async def get_watcher_events(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        watcher = self._find(sandbox_id, req)
        events = list(watcher.pending)
        watcher.pending.clear()
        return {"events": events}

    async def remove_watcher(self, sandbox_id: str, req: dict[str, Any]) -> dict[str, Any]:
        self._forget(sandbox_id, self._find(sandbox_id, req))
        return {}


def _event(line: bytes) -> dict[str, str] | None:
    try:
        event = json.loads(line)
    except ValueError:
        return None
    if not isinstance(event, dict) or not isinstance(event.get("name"), str):
        return None
    if event.get("type") not in _EVENT_TYPES:
        return None
    return {"name": event["name"], "type": event["type"]}


_EVENT_TYPES = frozenset(f"EVENT_TYPE_{kind}" for kind in ("CREATE", "WRITE", "REMOVE", "RENAME", "CHMOD"))
