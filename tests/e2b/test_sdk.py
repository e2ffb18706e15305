"""The unmodified e2b SDK, pointed at corral by environment variables alone, does what its users do."""

from __future__ import annotations

import os
import re
import threading
import time

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxQuery, SandboxState
from e2b.exceptions import NotFoundException, SandboxNotFoundException

from corral.agent.envd.connect import envelope
from tests.e2b.conftest import Corral

pytestmark = pytest.mark.timeout(120)


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
    mine = SandboxQuery(metadata={"suite": "e2b"}, state=[SandboxState.PAUSED])
    assert sandbox.sandbox_id in {s.sandbox_id for s in Sandbox.list(query=mine).next_items()}
    running = SandboxQuery(metadata={"suite": "e2b"}, state=[SandboxState.RUNNING])
    assert sandbox.sandbox_id not in {s.sandbox_id for s in Sandbox.list(query=running).next_items()}
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
        # Bob's own sandbox's access token opens Bob's sandbox only.
        bobs = http.post("/v2/sandboxes", json={}, headers={"X-API-KEY": corral.other_key}).json()
        for sid, status in ((sandbox.sandbox_id, 502), (bobs["sandboxID"], 200)):
            r = http.post(
                "/process.Process/List",
                json={},
                headers={"E2b-Sandbox-Id": sid, "X-Access-Token": bobs["envdAccessToken"]},
            )
            assert r.status_code == status, r.text
        assert (
            http.delete(
                f"/sandboxes/{bobs['sandboxID']}", headers={"X-API-KEY": corral.other_key}
            ).status_code
            == 204
        )
    assert sandbox.commands.run("true").exit_code == 0  # untouched


def test_a_stream_left_open_holds_nothing_back(sandbox: Sandbox, corral: Corral) -> None:
    headers = {
        "E2b-Sandbox-Id": sandbox.sandbox_id,
        "X-API-KEY": corral.key,
        "Content-Type": "application/connect+json",
    }
    start = envelope({"process": {"cmd": "yes"}})
    with (
        httpx.Client(base_url=corral.url, timeout=30) as http,
        http.stream("POST", "/process.Process/Start", content=start, headers=headers) as stream,
    ):
        first = next(stream.iter_raw())
        assert b'"start"' in first
        # Unread, the stream stalls the command (its output waits in a short queue), not the sandbox.
        assert sandbox.commands.run("echo still here").stdout == "still here\n"
        (listed,) = [p for p in sandbox.commands.list() if p.cmd == "yes"]
    # Closed, the command runs on (its output discarded) until it is killed.
    assert [p.pid for p in sandbox.commands.list() if p.cmd == "yes"] == [listed.pid]
    assert sandbox.commands.kill(listed.pid)
    deadline = time.monotonic() + 20
    while [p for p in sandbox.commands.list() if p.cmd == "yes"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in sandbox.commands.list() if p.cmd == "yes"]


def test_the_older_sdks_routes(corral: Corral) -> None:
    """SDK <= 2.50 creates with POST /sandboxes and connects with POST /sandboxes/{id}/connect."""
    with httpx.Client(base_url=corral.url, headers={"X-API-KEY": corral.key}) as http:
        r = http.post("/sandboxes", json={"templateID": "base", "timeout": 60, "metadata": {"v": "old"}})
        assert r.status_code == 201, r.text
        body = r.json()
        assert set(body) >= {"templateID", "sandboxID", "clientID", "envdVersion", "envdAccessToken"}
        sid = body["sandboxID"]
        r = http.post(f"/sandboxes/{sid}/connect", json={"timeout": 60})
        assert r.status_code == 200 and r.json()["sandboxID"] == sid
        r = http.get(f"/sandboxes/{sid}")
        assert (
            r.status_code == 200 and r.json()["state"] == "running" and r.json()["metadata"] == {"v": "old"}
        )
        assert r.json()["templateID"] == "default"
        listed = http.get("/sandboxes", params={"metadata": "v=old"}).json()
        assert [s["sandboxID"] for s in listed] == [sid]
        r = http.post(
            "/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sid, "X-Access-Token": body["envdAccessToken"]},
        )
        assert r.status_code == 200 and r.json() == {"processes": []}
        assert http.delete(f"/sandboxes/{sid}").status_code == 204
        assert http.get(f"/sandboxes/{sid}").status_code == 404
        r = http.post("/v2/sandboxes", json={"templateID": "base", "timeout": -1})
        assert r.status_code == 422 and r.json()["error_code"] == "invalid_request"


def _refusals(corral: Corral) -> float:
    for line in corral.admin.get("/metrics").text.splitlines():
        if line.startswith('corral_refusals_total{reason="no_capacity"}'):
            return float(line.split()[-1])
    return 0.0


def test_a_full_fleet_is_retried_by_the_sdk_itself(sdk_env: Corral) -> None:
    # As large as the largest host and stateful (charged in full): no host admits it while its headroom
    # is kept, yet it is no larger than a host (that would be a 422, never retried).
    total = max(h["memory_mb_total"] for h in sdk_env.admin.get("/v1/hosts").json()["hosts"])
    r = sdk_env.admin.post(
        "/v1/templates", json={"name": f"enormous-{total}", "memory_mb": total, "stateful": True}
    )
    assert r.status_code in (201, 409), r.text
    before = _refusals(sdk_env)
    with pytest.raises(Exception, match="does_not_fit"):
        Sandbox.create(template=f"enormous-{total}")
    # corral's 503 + Retry-After reached the SDK, which retried it (3 times by default) on its own.
    assert _refusals(sdk_env) - before == 4


def test_an_e2b_form_key_is_a_tenant_key(corral: Corral, monkeypatch: pytest.MonkeyPatch) -> None:
    # Named by its name, as every tenants route names it (its id, as the route first took it, too).
    r = corral.admin.post("/v1/tenants/alice/e2b-keys")
    assert r.status_code == 201, r.text
    assert (r.json()["tenant"], r.json()["tenant_id"]) == ("alice", corral.alice_id)
    key = r.json()["key"]
    assert corral.admin.post(f"/v1/tenants/{corral.alice_id}/e2b-keys").json()["tenant"] == "alice"
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", key)
    sb = Sandbox.create(api_key=key, api_url=corral.url, sandbox_url=corral.url)
    try:
        assert sb.commands.run("echo ok").stdout == "ok\n"
        # The same tenant: its other key sees the sandbox too.
        assert (
            Sandbox.get_info(sb.sandbox_id, api_key=corral.key, api_url=corral.url).sandbox_id
            == sb.sandbox_id
        )
    finally:
        sb.kill()
    assert corral.admin.post("/v1/tenants/nope/e2b-keys").status_code == 404
    # A tenant issues itself no keys; a name past any tenant's length is refused as input.
    with httpx.Client(base_url=corral.url, headers={"Authorization": f"Bearer {corral.key}"}) as alice:
        assert alice.post("/v1/tenants/alice/e2b-keys").status_code == 403
    long = corral.admin.post("/v1/tenants/" + "a" * 200 + "/e2b-keys")
    assert long.status_code == 422 and long.json()["error"]["code"] == "invalid_request"


def test_reattach_to_a_command_and_read_metrics(sandbox: Sandbox) -> None:
    handle = sandbox.commands.run("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo done", background=True)
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    sandbox.files.write("/tmp/go", "")
    result = again.wait()
    assert result.exit_code == 0 and result.stdout == "done\n"
    sample = sandbox.get_metrics()[-1]  # the present's, read as it was asked for
    assert sample.cpu_count >= 1 and sample.mem_total == sandbox.get_info().memory_mb * 1024 * 1024
    assert sample.mem_used > 0


def test_an_oom_killed_command_says_so(sandbox: Sandbox) -> None:
    """Killed by the out-of-memory killer: said on its stderr and as the command's error."""
    with pytest.raises(CommandExitException) as failed:
        sandbox.commands.run("python3 -c 'b = bytearray(3 * 1024 ** 3)'")
    # Killed by a signal, as E2B ends such a command (exit code -1, "signal: killed"), and why.
    assert failed.value.exit_code == -1 and (failed.value.error or "").startswith("signal: killed")
    assert "out-of-memory" in failed.value.stderr and "out-of-memory" in (failed.value.error or "")
    r = sandbox.commands.run("echo fine")
    assert r.exit_code == 0 and "out-of-memory" not in r.stderr
