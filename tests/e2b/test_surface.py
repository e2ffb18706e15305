"""The e2b SDK's wider surface against corral, each as E2B answers it: listing's order and filters,
what a paused sandbox reads as, connect's timeout, a killed command's end, symlinks, removal, gzip
uploads, create options corral refuses rather than drops, and data-plane calls it does not serve."""

from __future__ import annotations

import asyncio
import datetime
import itertools
import os
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2b import (
    AsyncSandbox,
    CommandExitException,
    FileType,
    NotFoundException,
    Sandbox,
    SandboxQuery,
    SandboxState,
    Volume,
)
from e2b.envd.filesystem import filesystem_connect
from e2b.envd.process import process_connect
from e2b.exceptions import InvalidArgumentException, SandboxException, VolumeException

from corral.agent.envd.connect import envelope
from corral.api.e2b.unserved import UNSERVED
from tests.e2b.conftest import Corral

STREAM = "application/connect+json"
PAUSED, RUNNING = SandboxState.PAUSED, SandboxState.RUNNING

pytestmark = pytest.mark.timeout(120)


def _ids(pager: object) -> list[list[str]]:
    pages = []
    while pager.has_next:  # type: ignore[attr-defined]
        pages.append([s.sandbox_id for s in pager.next_items()])  # type: ignore[attr-defined]
    return pages


def test_listing_is_newest_first_paged_ordered_and_filtered(sdk_env: Corral) -> None:
    tag = f"list-{time.monotonic_ns()}"
    boxes = [Sandbox.create(metadata={"tag": tag}) for _ in range(7)]
    made = [b.sandbox_id for b in boxes]
    try:
        mine = SandboxQuery(metadata={"tag": tag})
        pages = _ids(Sandbox.list(query=mine, limit=3))
        assert [len(p) for p in pages] == [3, 3, 1]
        assert [i for p in pages for i in p] == made[::-1]  # E2B lists the most recent first
        assert [i for p in _ids(Sandbox.list(query=mine, limit=3, order="asc")) for i in p] == made
        with pytest.raises(InvalidArgumentException):
            Sandbox.list(query=mine, order="sideways").next_items()  # type: ignore[arg-type]

        # Created and deleted while paging: nothing is seen twice, every survivor is seen.
        pager = Sandbox.list(query=mine, limit=3)
        seen = [s.sandbox_id for s in pager.next_items()]
        boxes[0].kill()
        late = Sandbox.create(metadata={"tag": tag})
        boxes.append(late)
        while pager.has_next:
            seen += [s.sandbox_id for s in pager.next_items()]
        assert seen == made[::-1][:6]  # newest first: the late one is ahead of the cursor

        # Start time and template.
        third = Sandbox.get_info(made[4]).started_at
        after = SandboxQuery(metadata={"tag": tag}, started_after=third)
        assert [i for p in _ids(Sandbox.list(query=after)) for i in p] == [late.sandbox_id, *made[:3:-1]]
        assert len(Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template="base")).next_items()) == 7
        assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, template="nope")).next_items() == []

        # States, alone and together.
        boxes[3].pause()

        def listed(*states: SandboxState) -> set[str]:
            query = SandboxQuery(metadata={"tag": tag}, state=list(states))
            return {s.sandbox_id for s in Sandbox.list(query=query).next_items()}

        by_state = {s: listed(*s) for s in ((PAUSED,), (RUNNING,), (RUNNING, PAUSED))}
        assert by_state[(PAUSED,)] == {made[3]}
        assert made[3] not in by_state[(RUNNING,)]
        assert by_state[(RUNNING, PAUSED)] == {*made[1:], late.sandbox_id}
    finally:
        for b in boxes:
            b.kill()


# The suite lists 15 (pages of 7, 7 and 1); `make e2b-listing` lists 100, as issue 28 asks.
LISTED = int(os.environ.get("CORRAL_E2B_LISTED", "15"))
PAGE = 7


def _flat(pages: list[list[str]]) -> list[str]:
    return [i for p in pages for i in p]


def test_many_listed_in_pages_of_seven_while_created_and_deleted(sdk_env: Corral) -> None:
    tag = f"many-{time.monotonic_ns()}"
    # Small enough that a hundred fit on the suite's two hosts beside the other tests' sandboxes.
    r = sdk_env.admin.post("/v1/templates", json={"name": "listing-small", "memory_mb": 32, "cpus": 0.02})
    assert r.status_code in (201, 409), r.text
    made = [
        Sandbox.create("listing-small", metadata={"tag": tag}, timeout=600).sandbox_id for _ in range(LISTED)
    ]
    late: list[str] = []
    try:
        mine = SandboxQuery(metadata={"tag": tag})
        pages = _ids(Sandbox.list(query=mine, limit=PAGE))
        assert [len(p) for p in pages[:-1]] == [PAGE] * (len(pages) - 1) and 0 < len(pages[-1]) <= PAGE
        assert _flat(pages) == made[::-1]
        assert _flat(_ids(Sandbox.list(query=mine, limit=PAGE, order="asc"))) == made

        pager = Sandbox.list(query=mine, limit=PAGE)
        seen = [s.sandbox_id for s in pager.next_items()]
        # Deleted: the newest (already seen) and the oldest (not reached yet); created: one more
        # (ahead of the cursor). Nothing is seen twice; every survivor behind the cursor is seen.
        assert Sandbox.kill(made[-1]) and Sandbox.kill(made[0])
        late.append(Sandbox.create("listing-small", metadata={"tag": tag}).sandbox_id)
        while pager.has_next:
            seen += [s.sandbox_id for s in pager.next_items()]
        assert seen == made[::-1][:-1]

        assert Sandbox.pause(made[1])
        both = _flat(
            _ids(Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[RUNNING, PAUSED]), limit=PAGE))
        )
        assert both == [*late, *made[-2:0:-1]]
        assert _flat(
            _ids(Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[PAUSED]), limit=PAGE))
        ) == [made[1]]
        running = _flat(
            _ids(Sandbox.list(query=SandboxQuery(metadata={"tag": tag}, state=[RUNNING]), limit=PAGE))
        )
        assert running == [*late, *made[-2:1:-1]]
    finally:
        for sandbox_id in made + late:
            Sandbox.kill(sandbox_id)  # False for those already gone


def test_listing_refuses_what_it_cannot_read(corral: Corral) -> None:
    with httpx.Client(base_url=corral.url, headers={"X-API-KEY": corral.key}) as http:
        for params in ({"order": "up"}, {"startedAfter": "yesterday"}, {"state": "gone"}):
            r = http.get("/v2/sandboxes", params=params)
            assert r.status_code == 422 and r.json()["error_code"] == "invalid_request", r.text


def test_a_paused_sandbox_is_not_running_and_connect_never_shortens_a_timeout(sdk_env: Corral) -> None:
    sb = Sandbox.create(timeout=600)
    try:
        end = sb.get_info().end_at
        Sandbox.connect(sb.sandbox_id, timeout=30)  # shorter: the running sandbox keeps its end
        assert sb.get_info().end_at == end
        Sandbox.connect(sb.sandbox_id, timeout=1200)
        assert sb.get_info().end_at - end > datetime.timedelta(seconds=500)
        sb.pause()
        assert not sb.is_running()  # as E2B: a paused sandbox does not answer its health check
        again = Sandbox.connect(sb.sandbox_id, timeout=60)
        assert again.is_running()
        left = again.get_info().end_at - datetime.datetime.now(datetime.UTC)
        assert datetime.timedelta(seconds=30) < left <= datetime.timedelta(seconds=61)
        assert again.get_info().lifecycle == {"on_timeout": "kill", "auto_resume": False}
    finally:
        sb.kill()


def test_a_killed_command_ends_its_wait_with_the_exit_exception(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("sleep 30", background=True)
    assert sandbox.commands.kill(handle.pid)
    with pytest.raises(CommandExitException) as killed:
        handle.wait()
    # What E2B's envd reports for a process a signal ended (Go's process state).
    assert (killed.value.exit_code, killed.value.error) == (-1, "signal: killed")
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("exit 4")
    assert (failed.value.exit_code, failed.value.error) == (4, "exit status 4")


def test_symlinks_removal_and_a_gzip_upload(sandbox: Sandbox) -> None:
    sandbox.commands.run(
        "mkdir -p /tmp/s/dir && echo hi > /tmp/s/file && chmod 640 /tmp/s/file"
        " && ln -s file /tmp/s/to-file && ln -s dir /tmp/s/to-dir && ln -s /nowhere /tmp/s/dangling"
    )
    listed = {e.name: e for e in sandbox.files.list("/tmp/s")}
    # E2B's envd: a link is marked a symlink, carries its target resolved in full and its target's
    # mode; one that leads nowhere has no type, and the SDK leaves it out of a listing.
    assert set(listed) == {"dir", "file", "to-file", "to-dir"}
    link = sandbox.files.get_info("/tmp/s/to-file")
    assert (link.type, link.symlink_target, link.mode) == (FileType.SYMLINK, "/tmp/s/file", 0o640)
    assert listed["to-dir"].symlink_target == "/tmp/s/dir" and listed["file"].symlink_target is None
    assert sandbox.files.read("/tmp/s/to-file") == "hi\n"  # followed
    sandbox.files.write("/tmp/s/to-dir/through", "x")
    assert sandbox.files.exists("/tmp/s/dir/through")

    sandbox.files.remove("/tmp/s/no-such-file")  # as E2B: already absent is removed
    sandbox.files.remove("/tmp/no/such/dir")
    sandbox.files.remove("/tmp/s/to-dir")  # the link, not what it leads to
    assert sandbox.files.exists("/tmp/s/dir/through")

    blob = b"corral " * 20_000
    sandbox.files.write("/tmp/s/packed", blob, gzip=True)
    assert sandbox.files.read("/tmp/s/packed", format="bytes") == blob


def test_a_gzip_upload_that_is_not_gzip_is_refused(sandbox: Sandbox, corral: Corral) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-API-KEY": corral.key,
        "Content-Type": "application/octet-stream",
    }
    with httpx.Client(base_url=corral.url, headers=headers) as http:
        for encoding, body in (("gzip", b"plainly not gzip"), ("br", b"x"), ("gzip", b"\x1f\x8b\x08")):
            r = http.post(
                "/files", params={"path": "/tmp/bad"}, content=body, headers={"Content-Encoding": encoding}
            )
            assert r.status_code == 400, r.text
    assert not sandbox.files.exists("/tmp/bad")


def test_create_options_corral_does_not_honour_are_refused_leaving_nothing(sdk_env: Corral) -> None:
    tag = f"opts-{time.monotonic_ns()}"
    refused_options: list[dict[str, Any]] = [
        {"mcp": {"exa": {"apiKey": "k"}}},  # no template: the SDK names its MCP gateway's
        {"mcp": {"exa": {"apiKey": "k"}}, "template": "base"},
        {"volume_mounts": {"/mnt/data": "vol"}},
    ]
    for options in refused_options:
        with pytest.raises(SandboxException) as refused:
            Sandbox.create(metadata={"tag": tag}, **options)
        # E2B's error shape, read by the SDK: the status, and a message that says what and why.
        assert "400" in str(refused.value) and "not supported" in str(refused.value), refused.value

        async def create_async(options: dict[str, Any] = options) -> None:
            await AsyncSandbox.create(metadata={"tag": tag}, **options)

        with pytest.raises(SandboxException, match="not supported"):
            asyncio.run(create_async())
    with httpx.Client(base_url=sdk_env.url, headers={"X-API-KEY": sdk_env.key}) as http:
        for body in (
            {"volumeMounts": [{"name": "v", "path": "/mnt"}]},
            {"iam": {"tokens": {"a": {}}}},
            {"secure": False},
        ):
            r = http.post("/v2/sandboxes", json={"metadata": {"tag": tag}, **body})
            assert r.status_code == 400, r.text
            assert r.json()["code"] == 400 and r.json()["error_code"] == "unsupported_option", r.text
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items() == []
    sb = Sandbox.create(metadata={"tag": tag}, lifecycle={"on_timeout": "kill"})
    sb.kill()
    with httpx.Client(base_url=sdk_env.url, headers={"X-API-KEY": sdk_env.key}) as http:
        # What the SDK itself refuses to send, refused when sent anyway.
        for body in (
            {"autoResume": {"enabled": True}},
            {"autoPause": True, "autoPauseMemory": False, "autoResume": {"enabled": True}},
        ):
            r = http.post("/v2/sandboxes", json={"metadata": {"tag": tag}, **body})
            assert r.status_code == 422 and r.json()["error_code"] == "invalid_request", r.text
    assert Sandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items() == []


def _envd_rpc_paths() -> list[tuple[str, bool]]:
    """Every RPC of the SDK's envd protocol, and whether it streams (read from its generated client)."""
    found: list[tuple[str, bool]] = []
    for module in (process_connect, filesystem_connect):
        for line in Path(module.__file__ or "").read_text().splitlines():
            match = re.match(r'\s*"(/[\w.]+/\w+)": Endpoint(?:Sync)?\.(\w+)\(', line)
            if match and (match[1], match[2] != "unary") not in found:
                found.append((match[1], match[2] != "unary"))
    return found


def test_every_envd_rpc_answers_in_protocol_and_leaves_the_connection_usable(
    sandbox: Sandbox, corral: Corral
) -> None:
    paths = _envd_rpc_paths()
    assert len(paths) >= 15  # process and filesystem, every method
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "X-API-KEY": corral.key}
    one_connection = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    with httpx.Client(base_url=corral.url, headers=headers, limits=one_connection, timeout=20) as http:
        for path, stream in paths:
            message = {"path": "/tmp/none", "process": {"pid": 999_999}}
            if path == "/process.Process/Start":
                message = {"process": {"cmd": "true"}}
            if stream:
                r = http.post(path, content=envelope(message), headers={"Content-Type": STREAM})
                # A stream answers 200 and ends in its end envelope, an error or not.
                assert r.status_code == 200 and r.headers["content-type"] == STREAM, (path, r.text)
            else:
                r = http.post(path, json=message)
                assert r.status_code < 500 or r.json()["code"] == "unimplemented", (path, r.text)
            # The same connection serves the next call.
            assert http.get("/health").status_code == 204, path
        # A known path under another method, and a name no protocol has.
        assert http.get("/process.Process/List").status_code == 405
        r = http.post("/filesystem.Filesystem/Nothing", json={})
        assert r.status_code == 501 and r.json()["code"] == "unimplemented"
        assert http.get("/health").status_code == 204
    # Through the SDK: a call corral does not serve raises, and the next call on its connection works.
    reader = sandbox.commands.run("cat", background=True, stdin=True)
    with pytest.raises(SandboxException, match=r"(?i)unimplemented"):
        sandbox.commands.stream_input(reader.pid, [b"streamed input"])
    assert sandbox.commands.run("echo still").stdout == "still\n"
    sandbox.commands.kill(reader.pid)


def test_metrics_over_a_time_range(sandbox: Sandbox) -> None:
    deadline = time.monotonic() + 30
    while len(samples := sandbox.get_metrics()) < 2:  # the host reads it at its heartbeats, and here
        assert time.monotonic() < deadline, samples
        time.sleep(0.5)
    at = [s.timestamp for s in samples]
    # Oldest first, one per E2B's sampling interval, each its memory as its host read it.
    assert all(b - a >= datetime.timedelta(seconds=5) for a, b in itertools.pairwise(at))
    memory = sandbox.get_info().memory_mb * 1024 * 1024
    assert all(s.mem_used > 0 and s.mem_total == memory for s in samples)

    # Whole seconds, both ends included, as the SDK sends them.
    assert [s.timestamp for s in sandbox.get_metrics(start=at[1], end=at[1])] == [at[1]]
    assert next(s.timestamp for s in sandbox.get_metrics(start=at[1])) == at[1]
    assert [s.timestamp for s in sandbox.get_metrics(end=at[0])] == at[:1]
    hour = datetime.timedelta(hours=1)
    assert sandbox.get_metrics(start=at[-1] + hour) == []
    assert sandbox.get_metrics(end=at[0] - hour) == []
    with pytest.raises(SandboxException, match="start is after end"):
        sandbox.get_metrics(start=at[1], end=at[0])


def test_metrics_ranges_a_tenant_cannot_read_are_refused(sandbox: Sandbox, corral: Corral) -> None:
    path = f"/sandboxes/{sandbox.sandbox_id}/metrics"
    with httpx.Client(base_url=corral.url, headers={"X-API-KEY": corral.key}) as http:
        for params in (
            {"start": "-1"},
            {"end": "soon"},
            {"start": str(2**41)},
            {"start": "1e3"},
            {"end": "nan"},
        ):
            r = http.get(path, params=params)
            assert r.status_code == 422 and r.json()["error_code"] == "invalid_request", (params, r.text)
        assert http.get(path, params={"start": 0, "end": 2**40}).status_code == 200
    with httpx.Client(base_url=corral.url, headers={"X-API-KEY": corral.other_key}) as bob:
        assert bob.get(path, params={"start": 0}).status_code == 404  # as a sandbox that does not exist


def test_calls_corral_does_not_serve_say_so_and_find_no_missing_sandbox(
    sandbox: Sandbox, corral: Corral
) -> None:
    for call in (sandbox.fork, sandbox.create_snapshot, lambda: sandbox.list_snapshots().next_items()):
        with pytest.raises(SandboxException) as refused:
            call()
        # Not a NotFoundException: the sandbox runs, the call is what corral does not do.
        assert not isinstance(refused.value, NotFoundException), refused.value
        assert "501" in str(refused.value) and "not supported by corral" in str(refused.value)
    with pytest.raises(VolumeException, match="not supported by corral"):
        Volume.list()
    sid = sandbox.sandbox_id
    with httpx.Client(base_url=corral.url) as http:
        for method, path in UNSERVED_CALLS:
            path = path.format(sandbox_id=sid, volume_id="v", what="file", secret_id="s")
            r = http.request(method, path, headers={"X-API-KEY": corral.key})
            assert r.status_code == 501, (method, path, r.text)
            assert r.json() == {
                "code": 501,
                "message": r.json()["message"],
                "error_code": "unsupported_operation",
            }
            # A caller without a key learns nothing more than anywhere else.
            assert http.request(method, path, headers={"X-API-KEY": "e2b_00"}).status_code == 401
    assert sandbox.is_running()


UNSERVED_CALLS = [(m, path) for methods, path, _ in UNSERVED for m in methods]
