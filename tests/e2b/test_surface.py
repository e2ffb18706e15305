"""The e2b SDK's wider surface against corral, each as E2B answers it: listing's order and filters,
what a paused sandbox reads as, connect's timeout, a killed command's end, symlinks, removal, gzip
uploads, create options corral refuses rather than drops, and data-plane calls it does not serve."""

from __future__ import annotations

import datetime
import re
import time
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, FileType, Sandbox, SandboxQuery, SandboxState
from e2b.envd.filesystem import filesystem_connect
from e2b.envd.process import process_connect
from e2b.exceptions import InvalidArgumentException, SandboxException

from corral.agent.envd.connect import envelope
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
    for options in ({"mcp": {"exa": {"apiKey": "k"}}, "template": "base"},):
        with pytest.raises(SandboxException) as refused:
            Sandbox.create(metadata={"tag": tag}, **options)  # type: ignore[arg-type]
        assert "not supported" in str(refused.value)
    with httpx.Client(base_url=sdk_env.url, headers={"X-API-KEY": sdk_env.key}) as http:
        for body in ({"volumeMounts": [{"name": "v", "path": "/mnt"}]}, {"iam": {"tokens": {"a": {}}}}):
            r = http.post("/v2/sandboxes", json={"metadata": {"tag": tag}, **body})
            assert r.status_code == 400 and r.json()["error_code"] == "unsupported_option", r.text
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
