"""Background commands against a real ``corral serve --runtime process``: started by one call, they
run on without a caller; a follower that goes away never ends one, a kill does; the SDK's handles
(sync and async) wait for, follow and kill them; ``corral exec --detach`` and ``corral logs -f``; and a
hostile tenant gets 429 past its sandbox's bound and costs its host bounded memory with a command
writing /dev/zero in the background."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral import cli
from corral.agent.commands import READ_BURST_BYTES, READ_RATE_BYTES_S, TAIL_BYTES
from corral.client import AsyncCorral, Corral
from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX
from corral.exec_result import ExecOutput, ExecResult
from tests.security.runtime_serve import ADMIN_TOKEN, Serve, running_serve

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from running_serve(tmp_path_factory)


@pytest.fixture
def sandbox(serve: Serve) -> Iterator[str]:
    sid = serve.create(memory_mb=128)
    yield sid
    serve.delete(sid)


def _token(serve: Serve) -> str:
    return str(serve.tenant.headers["Authorization"].removeprefix("Bearer "))


def _state(serve: Serve, sid: str, pid: int) -> dict[str, object]:
    r = serve.tenant.get(f"/v1/sandboxes/{sid}/commands/{pid}")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_a_command_runs_on_after_its_request_and_its_follower(serve: Serve, sandbox: str) -> None:
    r = serve.tenant.post(
        f"/v1/sandboxes/{sandbox}/commands", json={"command": "echo first; sleep 1; echo second; exit 4"}
    )
    assert r.status_code == 201, r.text
    handle = r.json()
    assert handle["sandbox_id"] == sandbox and handle["state"] == "running" and handle["started_at"]
    assert handle["command"] == ["/bin/sh", "-c", "echo first; sleep 1; echo second; exit 4"]
    pid = handle["pid"]
    path = f"/v1/sandboxes/{sandbox}/commands/{pid}"
    # A follower reads the first line, then goes away: the command runs on.
    with serve.tenant.stream("GET", f"{path}/output", params={"follow": "true"}) as streamed:
        assert streamed.status_code == 200
        assert next(line for line in streamed.iter_lines() if line) == '{"stdout":"first\\n"}'
    assert _state(serve, sandbox, pid)["state"] == "running"
    # Another reattaches: what was kept, what comes, and how it ended.
    with serve.tenant.stream("GET", f"{path}/output", params={"follow": "true"}) as streamed:
        lines = [line for line in streamed.iter_lines() if line]
    assert lines[:2] == ['{"stdout":"first\\n"}', '{"stdout":"second\\n"}'], lines
    assert '"exit_code":4' in lines[-1]
    done = serve.tenant.get(path, params={"wait_s": 5}).json()
    assert done["state"] == "ended" and done["exit_code"] == 4 and done["stdout_bytes"] == 13
    assert serve.tenant.get(f"{path}/output").json()["stdout"] == "first\nsecond\n"
    listed = serve.tenant.get(f"/v1/sandboxes/{sandbox}/commands").json()["commands"]
    assert [c["pid"] for c in listed] == [pid]
    # A made-up pid, and another tenant's view of the sandbox: 404 both.
    assert serve.tenant.get(f"/v1/sandboxes/{sandbox}/commands/999").status_code == 404
    assert serve.admin.post(f"/v1/sandboxes/{sandbox}/commands/999/kill").status_code == 404


def test_a_kill_ends_it_and_frees_its_slot(serve: Serve, sandbox: str) -> None:
    pid = serve.tenant.post(f"/v1/sandboxes/{sandbox}/commands", json={"command": ["sleep", "600"]}).json()[
        "pid"
    ]
    killed = serve.tenant.post(f"/v1/sandboxes/{sandbox}/commands/{pid}/kill")
    assert killed.status_code == 200, killed.text
    assert killed.json()["state"] == "ended" and killed.json()["killed"] and killed.json()["exit_code"] == 137
    # No sleep left in the sandbox (a zombie its init has yet to reap aside).
    still = serve.exec(sandbox, "cat /proc/[0-9]*/stat 2>/dev/null | grep '(sleep) [^ZX]' || true")
    assert still["stdout"] == "", still


def test_its_timeout_ends_it(serve: Serve, sandbox: str) -> None:
    r = serve.tenant.post(
        f"/v1/sandboxes/{sandbox}/commands", json={"command": ["sleep", "600"], "timeout_s": 0.5}
    )
    done = serve.tenant.get(
        f"/v1/sandboxes/{sandbox}/commands/{r.json()['pid']}", params={"wait_s": 10}
    ).json()
    assert done["state"] == "ended" and done["timed_out"] and done["exit_code"] == 137


def test_the_sdk_s_handles(serve: Serve, sandbox: str) -> None:
    with Corral(serve.proc.url, _token(serve)) as client:
        commands = client.sandboxes.commands(sandbox)
        handle = commands.start(["sh", "-c", "echo out; echo err >&2; exit 2"])
        result = handle.wait(timeout_s=30)
        assert (result.exit_code, result.stdout, result.stderr) == (2, "out\n", "err\n")
        assert not handle.running and handle.exit_code == 2
        slow = client.sandboxes.get(sandbox).commands.start("echo a; sleep 0.5; echo b")
        events = list(slow.follow())
        assert events[:-1] == [
            ExecOutput(stream="stdout", text="a\n"),
            ExecOutput(stream="stdout", text="b\n"),
        ]
        assert isinstance(events[-1], ExecResult) and events[-1].exit_code == 0
        hung = commands.start(["sleep", "600"])
        with pytest.raises(TimeoutError):
            hung.wait(timeout_s=0.2)
        assert hung.kill().killed
        assert {h.pid for h in commands.list()} >= {handle.pid, slow.pid, hung.pid}
        assert commands.get(hung.pid).exit_code == 137

    async def go() -> None:
        async with AsyncCorral(serve.proc.url, _token(serve)) as aclient:
            h = await aclient.sandboxes.commands(sandbox).start("echo async")
            got = [e async for e in h.follow()]
            assert got[0] == ExecOutput(stream="stdout", text="async\n")
            assert (await h.wait()).stdout == "async\n"

    asyncio.run(go())


def test_corral_exec_detach_then_logs(serve: Serve, sandbox: str, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {**os.environ, "CORRAL_URL": serve.proc.url, "CORRAL_TOKEN": ADMIN_TOKEN}
    detached = subprocess.run(
        [
            sys.executable,
            "-m",
            "corral",
            "exec",
            "--detach",
            sandbox,
            "--",
            "sh",
            "-c",
            # b waits for the test to open the gate: the first line is seen before b is written.
            "echo a; while [ ! -e /tmp/gate-detach ]; do sleep 0.02; done; echo b >&2; exit 3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert detached.returncode == 0, detached.stderr
    pid = detached.stdout.strip()
    assert pid.isdigit()
    follow = subprocess.Popen(
        [sys.executable, "-m", "corral", "logs", sandbox, pid, "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert follow.stdout is not None and follow.stderr is not None
        first = follow.stdout.readline()
        with Corral(serve.proc.url, ADMIN_TOKEN) as client:
            assert client.sandboxes.exec(sandbox, ["touch", "/tmp/gate-detach"]).exit_code == 0
        assert follow.wait(30) == 3
        rest = follow.stderr.read()
    finally:
        follow.kill()
    assert (first, rest) == (b"a\n", b"b\n")
    # Without -f: what was kept, each stream to its own; with no pid, the list.
    monkeypatch.setenv("CORRAL_URL", serve.proc.url)
    monkeypatch.setenv("CORRAL_TOKEN", ADMIN_TOKEN)
    runner = CliRunner()
    kept = runner.invoke(cli.app, ["logs", sandbox, pid])
    assert (kept.exit_code, kept.stdout, kept.stderr) == (0, "a\n", "b\n")
    listed = runner.invoke(cli.app, ["logs", sandbox])
    assert listed.exit_code == 0 and pid in listed.stdout and "ended" in listed.stdout, listed.output
    missing = runner.invoke(cli.app, ["logs", sandbox, "999"])
    assert missing.exit_code == 1 and "not_found" in missing.stderr


def test_past_the_sandbox_s_bound_a_background_start_is_refused(serve: Serve, sandbox: str) -> None:
    path = f"/v1/sandboxes/{sandbox}/commands"
    pids = []
    for _ in range(DEFAULT_EXECS_PER_SANDBOX):
        r = serve.tenant.post(path, json={"command": ["sleep", "600"]})
        assert r.status_code == 201, r.text
        pids.append(r.json()["pid"])
    refused = serve.tenant.post(path, json={"command": ["sleep", "600"]})
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_concurrent"
    assert serve.tenant.post(f"/v1/sandboxes/{sandbox}/exec", json={"command": ["true"]}).status_code == 429
    serve.tenant.post(f"{path}/{pids[0]}/kill")
    assert serve.tenant.post(f"/v1/sandboxes/{sandbox}/exec", json={"command": ["true"]}).status_code == 200


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_background_flood_costs_bounded_memory_and_is_read_at_a_bounded_rate(
    serve: Serve, sandbox: str
) -> None:
    before = _rss_kib(serve.proc.popen.pid)
    started = time.monotonic()
    pids = [
        serve.tenant.post(f"/v1/sandboxes/{sandbox}/commands", json={"command": ["cat", "/dev/zero"]}).json()[
            "pid"
        ]
        for _ in range(4)
    ]
    time.sleep(3)
    elapsed = time.monotonic() - started
    for pid in pids:
        now = _state(serve, sandbox, pid)
        assert now["state"] == "running"
        read = int(now["stdout_bytes"])  # type: ignore[call-overload]
        assert read <= READ_BURST_BYTES + READ_RATE_BYTES_S * elapsed + 64 * 1024, now
        assert read - int(now["stdout_dropped_bytes"]) <= TAIL_BYTES  # type: ignore[call-overload]
    grown_mib = (_rss_kib(serve.proc.popen.pid) - before) / 1024
    assert grown_mib < 4 * 2 * TAIL_BYTES / 2**20 + 32, f"the host's agent grew {grown_mib:.0f} MiB"
    for pid in pids:
        assert serve.tenant.post(f"/v1/sandboxes/{sandbox}/commands/{pid}/kill").json()["killed"]


def test_the_sandbox_s_end_ends_its_commands(serve: Serve) -> None:
    sid = serve.create(memory_mb=64)
    serve.tenant.post(f"/v1/sandboxes/{sid}/commands", json={"command": ["sleep", "600"]})
    serve.delete(sid)
    assert serve.tenant.get(f"/v1/sandboxes/{sid}/commands").status_code == 404
