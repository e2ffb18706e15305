"""What a new user meets, against a real ``corral serve --runtime process``: the docs' examples run as
they are written (every runnable block of README.md and docs/*.md, see ``docblocks``); with a long
command, the SDK waits as long as the command may run (not its own HTTP timeout), ``corral exec`` and
the SDK's callbacks see output as it is written, a caller that goes away kills its command, and a
command the OOM killer ended says so."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from corral import cli
from corral.client import Corral
from corral.exec_result import ExecOutput, ExecResult
from tests.security.runtime_serve import ADMIN_TOKEN, Serve, running_serve

from .docblocks import ROOT, Block, blocks, runnable

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from running_serve(tmp_path_factory)


@pytest.fixture(scope="module")
def sandbox(serve: Serve) -> Iterator[str]:
    sid = serve.create(memory_mb=64)
    yield sid
    serve.delete(sid)


def _tenant_token(serve: Serve) -> str:
    return str(serve.tenant.headers["Authorization"].removeprefix("Bearer "))


def test_an_exec_outlasting_the_clients_http_timeout_is_answered(serve: Serve, sandbox: str) -> None:
    # The client's own timeout is 0.5 s; the command's (and so the wait) is its own.
    with Corral(serve.proc.url, _tenant_token(serve), timeout_s=0.5) as client:
        r = client.sandboxes.exec(sandbox, "sleep 0.8; echo done", timeout_s=10)
    assert (r.exit_code, r.stdout) == (0, "done\n")


def test_streamed_output_arrives_as_it_is_written(serve: Serve, sandbox: str) -> None:
    # The command writes its second line only once the test has seen its first (a gate file the test
    # makes from another client): a first line held back until the result would hang it to its timeout.
    seen: list[str] = []
    first = threading.Event()

    def open_gate() -> None:
        if first.wait(30):
            with Corral(serve.proc.url, _tenant_token(serve)) as other:
                other.sandboxes.exec(sandbox, ["touch", "/tmp/gate-stream"])

    opener = threading.Thread(target=open_gate)
    opener.start()
    try:
        with Corral(serve.proc.url, _tenant_token(serve), timeout_s=0.5) as client:
            result = client.sandboxes.exec(
                sandbox,
                "echo one; while [ ! -e /tmp/gate-stream ]; do sleep 0.02; done; echo two >&2; echo three",
                timeout_s=20,
                on_stdout=lambda t: (seen.append("out:" + t), first.set()),
                on_stderr=lambda t: seen.append("err:" + t),
            )
    finally:
        first.set()
        opener.join()
    assert seen == ["out:one\n", "err:two\n", "out:three\n"]
    assert (result.exit_code, result.stdout, result.stderr, result.timed_out) == (
        0,
        "one\nthree\n",
        "two\n",
        False,
    )


def test_a_streamed_command_is_killed_when_its_caller_goes_away(serve: Serve, sandbox: str) -> None:
    with Corral(serve.proc.url, _tenant_token(serve)) as client:
        stream = client.sandboxes.exec_stream(sandbox, "echo $$; exec sleep 60", timeout_s=120)
        first = next(stream)
        assert isinstance(first, ExecOutput)
        pid = int(first.text)
        stream.close()  # the caller goes away
        deadline = time.monotonic() + 10
        while client.sandboxes.exec(sandbox, ["test", "-d", f"/proc/{pid}"]).exit_code == 0:
            assert time.monotonic() < deadline, "the command outlived its caller"
            time.sleep(0.2)


def test_a_unary_exec_is_killed_when_its_caller_goes_away(serve: Serve, sandbox: str) -> None:
    with pytest.raises(httpx.ReadTimeout), httpx.Client(base_url=serve.proc.url, timeout=1.0) as impatient:
        impatient.post(
            f"/v1/sandboxes/{sandbox}/exec",
            headers=serve.tenant.headers,
            json={"command": "echo $$ > /tmp/unary.pid; exec sleep 60", "timeout_s": 120},
        )
    pid = serve.exec(sandbox, ["cat", "/tmp/unary.pid"])["stdout"].strip()
    deadline = time.monotonic() + 10
    while serve.exec(sandbox, ["test", "-d", f"/proc/{pid}"])["exit_code"] == 0:
        assert time.monotonic() < deadline, "the command outlived its caller"
        time.sleep(0.2)


def test_a_streamed_command_is_killed_at_its_timeout(serve: Serve, sandbox: str) -> None:
    with Corral(serve.proc.url, _tenant_token(serve)) as client:
        events = list(client.sandboxes.exec_stream(sandbox, "echo up; sleep 30", timeout_s=1))
    result = events[-1]
    assert isinstance(result, ExecResult)
    assert result.timed_out and result.exit_code == 137 and not result.oom_killed
    assert events[0] == ExecOutput(stream="stdout", text="up\n")


def test_an_oom_killed_command_says_so_streamed(serve: Serve, sandbox: str) -> None:
    hog = ["python3", "-c", "b = bytearray(400 * 1024 * 1024)"]
    with Corral(serve.proc.url, _tenant_token(serve)) as client:
        result = client.sandboxes.exec(sandbox, hog, on_stderr=lambda _t: None)
    assert result.exit_code == 137 and result.oom_killed and not result.timed_out
    assert result.note is not None and "out-of-memory" in result.note


def test_corral_create_then_explain_then_rm(serve: Serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commands a user reaches for, as typed (in this process: the same code as the shell's)."""
    monkeypatch.setenv("CORRAL_URL", serve.proc.url)
    monkeypatch.setenv("CORRAL_TOKEN", ADMIN_TOKEN)
    runner = CliRunner()
    made = runner.invoke(cli.app, ["create", "--memory-mb", "64", "-e", "GREETING=hi", "--ttl", "600"])
    assert made.exit_code == 0, made.output
    sid = made.stdout.strip()
    said = runner.invoke(cli.app, ["exec", sid, "--", "sh", "-c", "echo $GREETING"])
    assert (said.exit_code, said.stdout) == (0, "hi\n")
    explained = runner.invoke(cli.app, ["explain", sid])
    assert explained.exit_code == 0 and "placed on host-0" in explained.stdout, explained.output
    assert runner.invoke(cli.app, ["rm", sid]).exit_code == 0
    gone = runner.invoke(cli.app, ["rm", sid])
    assert gone.exit_code == 1 and "not_found" in gone.stderr
    # With no token: the refusal, and where the token is.
    monkeypatch.delenv("CORRAL_TOKEN")
    refused = runner.invoke(cli.app, ["ps"])
    assert refused.exit_code == 1 and "unauthorized" in refused.stderr and "CORRAL_TOKEN" in refused.stderr


def test_corral_exec_streams_and_exits_with_the_commands_code(serve: Serve, sandbox: str) -> None:
    env = {**os.environ, "CORRAL_URL": serve.proc.url, "CORRAL_TOKEN": ADMIN_TOKEN}
    cmd = [
        sys.executable,
        "-m",
        "corral",
        "exec",
        sandbox,
        "--",
        "sh",
        "-c",
        # b waits for the test to open the gate: the first line is seen before b is written.
        "echo a; while [ ! -e /tmp/gate-exec ]; do sleep 0.02; done; echo b; exit 3",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        with Corral(serve.proc.url, ADMIN_TOKEN) as client:
            assert client.sandboxes.exec(sandbox, ["touch", "/tmp/gate-exec"]).exit_code == 0
        rest = proc.stdout.read()
        assert proc.wait(30) == 3
    finally:
        proc.kill()
    assert (first, rest) == (b"a\n", b"b\n")


@pytest.mark.parametrize("block", runnable(), ids=lambda b: b.name)
def test_the_docs_examples_run(
    block: Block, serve: Serve, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """As a user pastes it, with CORRAL_URL and CORRAL_TOKEN set as ``corral serve`` printed them."""
    monkeypatch.setenv("CORRAL_URL", serve.proc.url)
    monkeypatch.setenv("CORRAL_TOKEN", ADMIN_TOKEN)
    monkeypatch.chdir(tmp_path)
    if block.lang == "python":
        exec(compile(block.code, block.name, "exec"), {"__name__": "__doc_example__"})
        return
    # The venv's `corral` and `python` first on PATH, as after activating it.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout}\n{done.stderr}"


def test_the_doc_harness_runs_python_unless_skipped_and_shell_when_asked(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```python\nprint(1)\n```\n"
        "<!-- doc-test: skip: a sketch -->\n```python\nundefined()\n```\n"
        "```sh\nmake serve\n```\n"
        "<!-- doc-test: run -->\n```sh\ncorral ps\n```\n"
        "```json\n{}\n```\n"
    )
    found = blocks(doc)
    assert [(b.lang, b.line, b.run, b.why) for b in found] == [
        ("python", 1, True, None),
        ("python", 5, False, "a sketch"),
        ("sh", 8, False, None),
        ("sh", 12, True, None),
        ("json", 15, False, None),
    ]
    assert found[0].code == "print(1)\n"
    # The examples a new user tries first are among those run.
    names = {b.name for b in runnable()}
    for path in (ROOT / "docs" / "sdk.md", ROOT / "README.md", ROOT / "docs" / "e2b.md"):
        first = next(b for b in blocks(path) if b.lang in ("python", "sh") and b.why is None and b.run)
        assert first.name in names


def test_corral_shell_runs_line_after_line_keeping_the_directory_and_variables(
    serve: Serve, sandbox: str
) -> None:
    env = {**os.environ, "CORRAL_URL": serve.proc.url, "CORRAL_TOKEN": ADMIN_TOKEN}
    lines = [
        "cd /tmp",
        "pwd",
        "export GREETING=hi",
        'echo "$GREETING from $(pwd)"',
        "cd /does-not-exist",  # refused: the shell stays where it was
        "pwd; echo to-stderr >&2",
        "sh -c 'exit 4'",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "corral", "shell", sandbox],
        input="\n".join(lines) + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 4, done.stderr
    assert done.stdout == "/tmp\nhi from /tmp\n/tmp\n"
    assert "does-not-exist" in done.stderr and "to-stderr" in done.stderr
    # Leaving with `exit N` exits N; an id the caller cannot see is refused before any line runs.
    left = subprocess.run(
        [sys.executable, "-m", "corral", "shell", sandbox],
        input="exit 7\necho never\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (left.returncode, left.stdout) == (7, "")
    tenant_env = {**env, "CORRAL_TOKEN": _tenant_token(serve)}
    unknown = subprocess.run(
        [sys.executable, "-m", "corral", "shell", "sb-0000000000000000000000000"],
        input="id\n",
        env=tenant_env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert unknown.returncode == 1 and "not_found" in unknown.stderr and unknown.stdout == ""
