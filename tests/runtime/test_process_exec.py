"""exec: runs inside the sandbox's namespaces and cgroup, with env, cwd, bounded output and a timeout."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from corral.runtime.base import SandboxSpec
from corral.runtime.process import InvalidSandbox, ProcessRuntime
from corral.runtime.statedir import Running

pytestmark = pytest.mark.process


@pytest.fixture
async def box(process_runtime: ProcessRuntime) -> ProcessRuntime:
    await process_runtime.start(
        SandboxSpec(id="box", memory_mb=128, env={"FROM_SPEC": "spec", "SHARED": "spec"})
    )
    return process_runtime


async def test_exit_code_stdout_stderr(box: ProcessRuntime) -> None:
    result = await box.exec("box", ["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert not result.truncated and not result.timed_out
    assert result.duration_ms > 0


async def test_env_layers_spec_then_call(box: ProcessRuntime) -> None:
    result = await box.exec(
        "box",
        ["sh", "-c", "echo $FROM_SPEC $SHARED $FROM_CALL $HOME"],
        env={"SHARED": "call", "FROM_CALL": "c"},
    )
    assert result.stdout.split() == ["spec", "call", "c", "/home/user"]
    # The agent's own environment does not leak in.
    leaked = await box.exec("box", ["env"])
    assert "VIRTUAL_ENV" not in leaked.stdout and "PYTEST" not in leaked.stdout


async def test_cwd(box: ProcessRuntime) -> None:
    assert (await box.exec("box", ["pwd"])).stdout == "/home/user\n"
    assert (await box.exec("box", ["pwd"], cwd="/tmp")).stdout == "/tmp\n"
    missing = await box.exec("box", ["pwd"], cwd="/does/not/exist")
    assert missing.exit_code != 0 and missing.stderr


async def test_exec_runs_in_the_sandbox_cgroup_and_namespaces(box: ProcessRuntime) -> None:
    record = box.statedir.load("box")
    assert isinstance(record, Running)
    result = await box.exec("box", ["sh", "-c", "cat /proc/self/cgroup; stat -L -c %i /proc/self/ns/pid"])
    memory_line = next(line for line in result.stdout.splitlines() if ":memory:" in line)
    assert memory_line.endswith(":/")  # the root of its own cgroup namespace: its sandbox cgroup
    # The sandbox init's pid namespace (its own /proc/1/ns is closed to the tenant: not dumpable).
    assert int(result.stdout.splitlines()[-1]) == record.init.pid_ns


async def test_output_is_bounded(make_process_runtime: Callable[..., ProcessRuntime]) -> None:
    process_runtime = make_process_runtime(output_limit_bytes=1000)
    await process_runtime.start(SandboxSpec(id="chatty", memory_mb=128))
    result = await process_runtime.exec(
        "chatty", ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' a; echo done >&2"]
    )
    assert result.truncated
    assert result.stdout == "a" * 1000
    assert result.stderr == "done\n"  # the other stream is bounded separately
    assert result.exit_code == 0  # the writer was drained, never blocked


async def test_timeout_kills_the_command(box: ProcessRuntime) -> None:
    result = await box.exec("box", ["sh", "-c", "echo started; sleep 600"], timeout_s=0.5)
    assert result.timed_out
    assert result.exit_code == 137
    assert result.stdout == "started\n"  # output up to the kill is kept
    left = await box.exec("box", ["sh", "-c", "ps -eo args | grep -c '^sleep 600' || true"])
    assert left.stdout.strip() == "0"


async def test_background_child_holding_the_pipe_does_not_hang_exec(box: ProcessRuntime) -> None:
    result = await box.exec("box", ["sh", "-c", "setsid sleep 600 & echo launched"], timeout_s=1.0)
    assert result.stdout == "launched\n"
    assert result.exit_code == 0


async def test_missing_command(box: ProcessRuntime) -> None:
    result = await box.exec("box", ["no-such-command"])
    assert result.exit_code == 127
    assert "no-such-command" in result.stderr


async def test_binary_output_is_replaced_not_fatal(box: ProcessRuntime) -> None:
    result = await box.exec("box", ["printf", "\\377\\376ok"])
    assert result.stdout.endswith("ok")


@pytest.mark.parametrize(
    ("command", "kwargs", "message"),
    [
        ([], {}, "command"),
        (["echo", "a\0b"], {}, "command"),
        (["true"], {"timeout_s": 0}, "timeout_s"),
        (["true"], {"cwd": "relative"}, "cwd"),
        (["true"], {"env": {"": "x"}}, "environment"),
    ],
)
async def test_bad_exec_input(
    box: ProcessRuntime, command: list[str], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidSandbox, match=message):
        await box.exec("box", command, **kwargs)  # type: ignore[arg-type]
