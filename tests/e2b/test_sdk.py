"""The unmodified e2b SDK, pointed at corral by environment variables alone, does what its users do."""

from __future__ import annotations

import os
import threading
import time

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxNotFoundException

from tests.e2b.conftest import Corral

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def sandbox(sdk_env: Corral) -> Sandbox:
    sb = Sandbox.create(metadata={"suite": "e2b"})
    yield sb
    sb.kill()


def test_create_run_and_exit_codes(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo hi")
    assert (r.stdout, r.stderr, r.exit_code) == ("hi\n", "", 0)
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("echo oops >&2; exit 3")
    assert failed.value.exit_code == 3 and failed.value.stderr == "oops\n"
    assert sandbox.get_info().state == SandboxState.RUNNING


def test_env_cwd_and_the_sandbox_user(sandbox: Sandbox) -> None:
    r = sandbox.commands.run("echo $GREETING; pwd; whoami", envs={"GREETING": "hello"}, cwd="/tmp")
    assert r.stdout == "hello\n/tmp\nuser\n"
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"


def test_output_streams_in_order_while_the_command_runs(sandbox: Sandbox) -> None:
    seen: list[tuple[float, str]] = []
    marker = "/tmp/release"
    releaser = threading.Timer(1.5, lambda: sandbox.files.write(marker, "go"))
    releaser.start()
    script = f"for i in 1 2 3; do echo line$i; done; while [ ! -e {marker} ]; do sleep 0.05; done; echo after"
    r = sandbox.commands.run(script, on_stdout=lambda s: seen.append((time.monotonic(), s)))
    releaser.join()
    lines = "".join(s for _, s in seen).split()
    assert lines == ["line1", "line2", "line3", "after"]
    assert r.stdout == "line1\nline2\nline3\nafter\n"
    # The first lines arrived before the command could finish (it waited for the marker).
    assert "line1" in seen[0][1] and "after" not in seen[0][1]


def test_files_round_trip(sandbox: Sandbox) -> None:
    info = sandbox.files.write("notes/hello.txt", "hello, corral")
    assert info.path == "/home/user/notes/hello.txt"
    assert sandbox.files.read("/home/user/notes/hello.txt") == "hello, corral"
    blob = os.urandom(1024 * 1024)
    sandbox.files.write("/tmp/blob.bin", blob)
    assert sandbox.files.read("/tmp/blob.bin", format="bytes") == blob
    assert sandbox.commands.run("wc -c < /tmp/blob.bin").stdout.strip() == str(len(blob))
    names = {e.name for e in sandbox.files.list("/home/user/notes")}
    assert names == {"hello.txt"}
    assert sandbox.files.make_dir("/tmp/d") and not sandbox.files.make_dir("/tmp/d")
    sandbox.files.rename("/home/user/notes/hello.txt", "/tmp/d/moved.txt")
    assert sandbox.files.exists("/tmp/d/moved.txt") and not sandbox.files.exists("/home/user/notes/hello.txt")
    sandbox.files.remove("/tmp/d")
    assert not sandbox.files.exists("/tmp/d")
    with pytest.raises(NotFoundException):
        sandbox.files.read("/no/such/file")


def test_list_filters_by_metadata_and_paginates(sdk_env: Corral) -> None:
    tag = f"run-{time.monotonic_ns()}"
    boxes = [Sandbox.create(metadata={"tag": tag, "i": str(i)}) for i in range(3)]
    try:
        pager = Sandbox.list(query=SandboxQuery(metadata={"tag": tag}), limit=2)
        first = pager.next_items()
        assert len(first) == 2 and pager.has_next
        rest = pager.next_items()
        assert not pager.has_next
        ids = {s.sandbox_id for s in first + rest}
        assert ids == {b.sandbox_id for b in boxes}
        assert all(s.metadata["tag"] == tag for s in first + rest)
    finally:
        for b in boxes:
            b.kill()


def test_set_timeout_expires_the_sandbox(sdk_env: Corral) -> None:
    sb = Sandbox.create(timeout=300)
    sb.set_timeout(1)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and sb.is_running():
        time.sleep(0.25)
    assert not sb.is_running()
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sb.sandbox_id)


def test_pause_then_resume_keeps_a_running_process(sandbox: Sandbox) -> None:
    sandbox.commands.run(
        "sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.05; done'", background=True
    )
    time.sleep(0.5)
    sandbox.pause()
    assert sandbox.get_info().state == SandboxState.PAUSED
    with httpx.Client(base_url=sandbox.connection_config.api_url) as http:
        again = http.post(
            f"/sandboxes/{sandbox.sandbox_id}/pause", headers={"X-API-KEY": sandbox.connection_config.api_key}
        )
    assert again.status_code == 409 and again.json()["code"] == 409
    resumed = Sandbox.connect(sandbox.sandbox_id)
    assert resumed.get_info().state == SandboxState.RUNNING
    before = int(resumed.commands.run("cat /tmp/count").stdout)
    time.sleep(0.5)
    after = int(resumed.commands.run("cat /tmp/count").stdout)
    assert before > 0 and after > before  # the same loop, counting on from where it stood


def test_kill(sdk_env: Corral) -> None:
    sb = Sandbox.create()
    assert sb.kill()
    assert not sb.is_running()
    assert not Sandbox.kill(sb.sandbox_id)


def test_another_tenants_key_reaches_nothing(sandbox: Sandbox, corral: Corral) -> None:
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sandbox.sandbox_id, api_key=corral.other_key)
    with httpx.Client(base_url=corral.url) as http:
        for headers in ({"X-API-KEY": corral.other_key}, {"X-Access-Token": "0" * 64}, {}):
            r = http.post(
                "/process.Process/List",
                json={},
                headers={"E2b-Sandbox-Id": sandbox.sandbox_id, **headers},
            )
            assert r.status_code == 502 and "was not found" in r.json()["message"]
        r = http.delete(f"/sandboxes/{sandbox.sandbox_id}", headers={"X-API-KEY": corral.other_key})
        assert r.status_code == 404 and r.json()["code"] == 404
    assert sandbox.commands.run("true").exit_code == 0  # untouched
