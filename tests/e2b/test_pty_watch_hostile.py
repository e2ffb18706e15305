"""A hostile tenant against the data plane's terminals and directory watches, with real sandboxes:
input floods, sizes out of range, watches through symlinks that point out, too many watches, event
floods, and a sandbox stopped under its watches."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from corral.agent.envd import Envd, processes, watch
from corral.agent.envd.calls import MAX_MESSAGE_BYTES
from corral.agent.envd.connect import envelope
from corral.runtime.process import ProcessRuntime
from tests.e2b.test_envd_hostile import SID, app, envd, run  # noqa: F401
from tests.runtime.conftest import cgroup_root, make_process_runtime, process_runtime  # noqa: F401

pytestmark = pytest.mark.process
STREAM = {"Content-Type": "application/connect+json"}


async def eventually(probe: Callable[[], bool | Awaitable[bool]], within_s: float = 30.0) -> bool:
    """Poll until ``probe`` holds; the bound only keeps a broken test from hanging."""
    for _ in range(int(within_s / 0.05)):
        held = probe()
        if held if isinstance(held, bool) else await held:
            return True
        await asyncio.sleep(0.05)
    return False


def frames(body: bytes) -> list[dict[str, object]]:
    out, at = [], 0
    while at + 5 <= len(body):
        size = int.from_bytes(body[at + 1 : at + 5], "big")
        out.append(json.loads(body[at + 5 : at + 5 + size]))
        at += 5 + size
    return out


async def started(
    plane: Envd, client: httpx.AsyncClient, message: dict[str, object]
) -> tuple[int, asyncio.Task[httpx.Response]]:
    """A Start whose stream runs on in a task (the test client answers a stream once it ends)."""
    before = set(plane.processes.runs.get(SID, {}))
    task = asyncio.create_task(
        client.post("/process.Process/Start", content=envelope(message), headers=STREAM)
    )
    assert await eventually(lambda: bool(set(plane.processes.runs.get(SID, {})) - before) or task.done())
    assert not task.done(), task.result().content
    (pid,) = set(plane.processes.runs[SID]) - before
    return pid, task


async def test_a_terminal_input_flood_is_held_to_a_bound(
    app: Envd,  # noqa: F811
    envd: httpx.AsyncClient,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(processes, "INPUT_WAIT_S", 0.05)
    # A terminal whose program never reads: the kernel's buffers fill, then the agent's, then no more.
    pid, stream = await started(
        app, envd, {"process": {"cmd": "sleep", "args": ["300"]}, "pty": {"size": {"rows": 24, "cols": 80}}}
    )
    chunk = base64.b64encode(b"y" * (512 * 1024)).decode()
    answers = []
    for _ in range(32):
        r = await envd.post(
            "/process.Process/SendInput", json={"process": {"pid": pid}, "input": {"pty": chunk}}
        )
        answers.append(r.status_code)
        if r.status_code != 200:
            break
    assert answers[-1] == 429 and r.json()["code"] == "resource_exhausted", answers
    assert "not reading its input" in r.json()["message"]
    held = app.processes.runs[SID][pid].spawned.stdin
    assert held is not None
    assert held.transport.get_write_buffer_size() <= processes.INPUT_BACKLOG_BYTES + MAX_MESSAGE_BYTES
    # The data plane serves on, and the terminal is killed as any process is.
    assert (await envd.post("/filesystem.Filesystem/Stat", json={"path": "/"})).status_code == 200
    r = await envd.post(
        "/process.Process/SendSignal", json={"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}
    )
    assert r.status_code == 200
    events = frames((await stream).content)
    end = events[-2]["event"]
    assert end == {
        "end": {"exitCode": -1, "exited": False, "status": "signal: killed", "error": "signal: killed"}
    }


async def test_terminal_requests_out_of_range_are_refused(app: Envd, envd: httpx.AsyncClient) -> None:  # noqa: F811
    for size in (
        {"rows": 0, "cols": 80},
        {"rows": 24, "cols": 70000},
        {"rows": "24", "cols": 80},
        {"rows": True, "cols": 1},
        {},
    ):
        r = await envd.post(
            "/process.Process/Start",
            content=envelope({"process": {"cmd": "sh"}, "pty": {"size": size}}),
            headers=STREAM,
        )
        assert frames(r.content)[-1]["error"]["code"] == "invalid_argument", size  # type: ignore[index]
    # Terminal input and size are for a terminal's process; stdin for one without.
    pid, stream = await started(app, envd, {"process": {"cmd": "cat"}, "stdin": True})
    for path, body in (
        ("/process.Process/SendInput", {"input": {"pty": base64.b64encode(b"x").decode()}}),
        ("/process.Process/SendInput", {"input": {"stdin": "eA==", "pty": "eA=="}}),
        ("/process.Process/Update", {"pty": {"size": {"rows": 3, "cols": 3}}}),
    ):
        r = await envd.post(path, json={"process": {"pid": pid}, **body})
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument", (path, r.text)
    tty, tty_stream = await started(
        app, envd, {"process": {"cmd": "cat"}, "pty": {"size": {"rows": 5, "cols": 5}}}
    )
    for size in ({"rows": 0, "cols": 5}, {"rows": 5, "cols": 1 << 16}):
        r = await envd.post("/process.Process/Update", json={"process": {"pid": tty}, "pty": {"size": size}})
        assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    for each in (pid, tty):
        await envd.post(
            "/process.Process/SendSignal", json={"process": {"pid": each}, "signal": "SIGNAL_SIGKILL"}
        )
    await stream, await tty_stream


async def test_a_watch_follows_the_sandbox_s_view_of_a_symlink(
    envd: httpx.AsyncClient,  # noqa: F811
    process_runtime: ProcessRuntime,  # noqa: F811
    tmp_path: Path,
) -> None:
    host_dir = tmp_path / "host-dir"
    host_dir.mkdir()
    # A symlink to a host directory names nothing in the sandbox (its /tmp is its own)...
    await run(
        process_runtime, f"ln -s {host_dir} /home/user/out; ln -s /proc/1/root/tmp /home/user/init-root"
    )
    for path in ("/home/user/out", "/home/user/init-root", str(host_dir)):
        r = await envd.post("/filesystem.Filesystem/CreateWatcher", json={"path": path})
        assert r.status_code == 404 and r.json()["code"] == "not_found", (path, r.text)
    # ...and once the sandbox has a directory of that name, the watch is on the sandbox's.
    await run(process_runtime, f"mkdir -p {host_dir}")
    r = await envd.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/home/user/out"})
    assert r.status_code == 200, r.text
    watcher = {"watcherId": r.json()["watcherId"]}
    (host_dir / "on-the-host").write_text("x")
    await run(process_runtime, f"touch {host_dir}/in-the-sandbox")
    seen: list[str] = []

    async def got_it() -> bool:
        r = await envd.post("/filesystem.Filesystem/GetWatcherEvents", json=watcher)
        seen.extend(e["name"] for e in r.json()["events"])
        return "in-the-sandbox" in seen

    assert await eventually(got_it)
    assert "on-the-host" not in seen
    # A file is not a directory to watch (E2B's invalid_argument); a path that is not there, not_found.
    await run(process_runtime, "touch /tmp/plain")
    r = await envd.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/tmp/plain"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument", r.text
    r = await envd.post(
        "/filesystem.Filesystem/WatchDir", content=envelope({"path": "/nope"}), headers=STREAM
    )
    assert frames(r.content)[-1]["error"]["code"] == "not_found"  # type: ignore[index]


async def test_watches_are_bounded_and_end_with_their_sandbox(
    app: Envd,  # noqa: F811
    envd: httpx.AsyncClient,  # noqa: F811
    process_runtime: ProcessRuntime,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(watch, "MAX_PENDING_EVENTS", 50)
    await run(process_runtime, "mkdir /tmp/flood")
    ids = []
    for _ in range(watch.MAX_WATCHERS):
        r = await envd.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/tmp/flood"})
        assert r.status_code == 200, r.text
        ids.append(r.json()["watcherId"])
    r = await envd.post("/filesystem.Filesystem/CreateWatcher", json={"path": "/tmp/flood"})
    assert r.status_code == 429 and r.json()["code"] == "resource_exhausted", r.text
    r = await envd.post(
        "/filesystem.Filesystem/WatchDir", content=envelope({"path": "/tmp/flood"}), headers=STREAM
    )
    assert frames(r.content)[-1]["error"]["code"] == "resource_exhausted"  # type: ignore[index]
    assert (
        await envd.post("/filesystem.Filesystem/RemoveWatcher", json={"watcherId": ids.pop()})
    ).status_code == 200
    r = await envd.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": "f" * 16})
    assert r.status_code == 404
    # A flood of events into a watch nobody polls: it keeps its bound, the rest are dropped.
    await run(process_runtime, "cd /tmp/flood && for i in $(seq 1 300); do : > f$i; done")
    first = app.watches.watchers[SID][ids[0]]
    assert await eventually(lambda: first.dropped > 0)
    assert len(first.pending) == 50
    r = await envd.post("/filesystem.Filesystem/GetWatcherEvents", json={"watcherId": ids[0]})
    assert len(r.json()["events"]) == 50
    # The sandbox stops: its watches end with it, and are forgotten.
    await app.agent.stop(SID)
    assert await eventually(lambda: SID not in app.watches.watchers)
