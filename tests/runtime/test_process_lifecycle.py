"""Start, stop, re-adoption and the leftovers of crashes: nothing leaks, nothing is adopted wrongly."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from corral.runtime import procfs
from corral.runtime.base import RuntimeFailure, SandboxNotFound, SandboxSpec
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.process import InvalidSandbox, ProcessRuntime, SandboxExists
from corral.runtime.statedir import Running, Starting

pytestmark = pytest.mark.process

Factory = Callable[..., ProcessRuntime]


def _gone(pid: int) -> bool:
    """No such process, or only a zombie waiting for its reaper (it holds no memory and no cgroup)."""
    return procfs.identify(pid) is None


async def test_start_returns_a_handle_and_first_exec_works(process_runtime: ProcessRuntime) -> None:
    spec = SandboxSpec(id="hello", memory_mb=128, env={"GREETING": "hi"})
    handle = await process_runtime.start(spec)
    assert handle.id == "hello" and handle.spec == spec
    assert handle.ref.startswith("pid=")
    result = await process_runtime.exec("hello", ["sh", "-c", "echo $GREETING"])
    assert result.stdout == "hi\n"
    assert [h.id for h in await process_runtime.list()] == ["hello"]


async def test_stop_leaves_no_process_no_cgroup_no_state(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="doomed", memory_mb=128))
    # Something long-running inside, started by exec, must die with the sandbox too.
    await process_runtime.exec("doomed", ["sh", "-c", "sleep 600 >/dev/null 2>&1 &"])
    record = process_runtime.statedir.load("doomed")
    assert isinstance(record, Running) and record.cgroup is not None
    cgroup = Path(record.cgroup)
    members = [int(pid) for pid in (cgroup / "cgroup.procs").read_text().split()]
    assert len(members) >= 3  # bubblewrap's monitor, the init, the exec'd sleep

    await process_runtime.stop("doomed")

    assert not cgroup.exists()
    assert all(_gone(pid) for pid in [*members, record.init.pid, record.monitor.pid])
    assert not process_runtime.statedir.dir("doomed").exists()
    assert await process_runtime.list() == []
    with pytest.raises(SandboxNotFound):
        await process_runtime.stop("doomed")
    with pytest.raises(SandboxNotFound):
        await process_runtime.exec("doomed", ["true"])
    with pytest.raises(SandboxNotFound):
        await process_runtime.resident_mb("doomed")


async def test_a_new_runtime_readopts_running_sandboxes(make_process_runtime: Factory) -> None:
    first = make_process_runtime()
    specs = [SandboxSpec(id=f"keep-{i}", memory_mb=96, hostname=f"k{i}", env={"N": str(i)}) for i in range(2)]
    started = [await first.start(spec) for spec in specs]
    await first.exec("keep-0", ["sh", "-c", "echo state > $HOME/mark"])

    second = make_process_runtime()  # as an agent restarted over the same state directory would
    adopted = sorted(await second.list(), key=lambda h: h.id)
    assert [(h.id, h.spec, h.started_at, h.ref) for h in adopted] == [
        (h.id, h.spec, h.started_at, h.ref) for h in started
    ]
    # Fully usable through the new object: exec, memory, stop.
    again = await second.exec("keep-0", ["sh", "-c", "cat $HOME/mark; hostname; echo $N"])
    assert again.stdout.split() == ["state", "k0", "0"]
    assert await second.resident_mb("keep-1") is not None
    await second.stop("keep-1")
    assert [h.id for h in await first.list()] == ["keep-0"]


async def test_a_recycled_pid_is_not_adopted_and_not_killed(
    make_process_runtime: Factory, tmp_path: Path
) -> None:
    process_runtime = make_process_runtime()
    await process_runtime.start(SandboxSpec(id="real", memory_mb=96))
    real = process_runtime.statedir.load("real")
    assert isinstance(real, Running)
    # A record whose init pid now belongs to an unrelated process (same pid, another start time).
    stranger = subprocess.Popen(["sleep", "600"])
    try:
        identity = procfs.identify(stranger.pid)
        assert identity is not None
        forged = Running(
            spec=SandboxSpec(id="ghost", memory_mb=96),
            started_at=0.0,
            init=procfs.ProcessIdentity(stranger.pid, identity.start_ticks + 1, identity.pid_ns),
            monitor=procfs.ProcessIdentity(stranger.pid, identity.start_ticks + 1, identity.pid_ns),
            cgroup=None,
            cgroup_version=None,
        )
        process_runtime.statedir.dir("ghost").mkdir()
        (process_runtime.statedir.dir("ghost") / "sandbox.json").write_text(json.dumps(forged.to_dict()))

        assert [h.id for h in await process_runtime.list()] == ["real"]
        assert stranger.poll() is None  # left alone
        assert not process_runtime.statedir.dir("ghost").exists()  # the stale record is cleaned up
        with pytest.raises(SandboxNotFound):
            await process_runtime.exec("ghost", ["true"])
    finally:
        stranger.kill()
        stranger.wait()


async def test_a_dead_sandbox_is_cleaned_up_by_list(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    await process_runtime.start(SandboxSpec(id="dies", memory_mb=96))
    record = process_runtime.statedir.load("dies")
    assert isinstance(record, Running) and record.cgroup is not None
    os.kill(record.init.pid, 9)  # the sandbox dies behind the runtime's back

    async def forgotten() -> bool:
        return await process_runtime.list() == []

    assert await eventually(forgotten)
    assert not Path(record.cgroup).exists()
    assert not process_runtime.statedir.dir("dies").exists()


async def test_a_crash_mid_start_is_cleaned_up(
    process_runtime: ProcessRuntime, cgroup_root: CgroupRoot
) -> None:
    # What a crash between "cgroup created" and "sandbox recorded" leaves: intent, cgroup, a process.
    cgroup = cgroup_root.child("half")
    cgroup.create(64)
    orphan = subprocess.Popen(["/bin/sh", "-c", 'echo $$ > "$0" && exec sleep 600', str(cgroup.procs_file)])
    while orphan.pid not in cgroup.pids():  # the crash left it running inside the cgroup
        assert orphan.poll() is None
        await asyncio.sleep(0.005)
    dead_agent = procfs.ProcessIdentity(pid=orphan.pid, start_ticks=1, pid_ns=0)  # not alive as recorded
    process_runtime.statedir.claim(
        "half",
        Starting(
            starter=dead_agent,
            cgroup=str(cgroup.path),
            cgroup_version=cgroup.version,
            cgroup_extra=tuple(map(str, cgroup.extra)),
        ),
    )
    assert await process_runtime.list() == []
    assert orphan.wait(timeout=10) == -9
    assert not cgroup.exists() and not any(p.exists() for p in cgroup.extra)
    assert not process_runtime.statedir.dir("half").exists()


async def test_a_start_in_progress_elsewhere_is_left_alone(process_runtime: ProcessRuntime) -> None:
    me = procfs.identify(os.getpid())
    assert me is not None
    process_runtime.statedir.claim("busy", Starting(starter=me, cgroup=None, cgroup_version=None))
    assert await process_runtime.list() == []
    assert process_runtime.statedir.dir("busy").exists()
    await process_runtime.stop("busy")  # an operator may still remove it
    assert not process_runtime.statedir.dir("busy").exists()


async def test_eight_concurrent_starts(process_runtime: ProcessRuntime) -> None:
    specs = [SandboxSpec(id=f"burst-{i}", memory_mb=64) for i in range(8)]
    handles = await asyncio.gather(*(process_runtime.start(spec) for spec in specs))
    assert len({h.ref for h in handles}) == 8
    outputs = await asyncio.gather(*(process_runtime.exec(s.id, ["hostname"]) for s in specs))
    assert [o.stdout.strip() for o in outputs] == [s.id for s in specs]
    await asyncio.gather(*(process_runtime.stop(s.id) for s in specs))
    assert await process_runtime.list() == []


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (SandboxSpec(id="../escape", memory_mb=64), "sandbox id"),
        (SandboxSpec(id="", memory_mb=64), "sandbox id"),
        (SandboxSpec(id="x" * 129, memory_mb=64), "sandbox id"),
        (SandboxSpec(id="tiny", memory_mb=4), "memory_mb"),
        (SandboxSpec(id="env", memory_mb=64, env={"A=B": "c"}), "environment"),
        (SandboxSpec(id="host", memory_mb=64, hostname="h" * 65), "hostname"),
    ],
)
async def test_invalid_specs_are_refused_and_leave_nothing(
    process_runtime: ProcessRuntime, spec: SandboxSpec, message: str
) -> None:
    with pytest.raises(InvalidSandbox, match=message) as refused:
        await process_runtime.start(spec)
    assert refused.value.code == "invalid_request"
    assert list(process_runtime.statedir.ids()) == []


async def test_duplicate_id_is_refused_and_the_first_keeps_running(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="twin", memory_mb=64))
    with pytest.raises(SandboxExists) as refused:
        await process_runtime.start(SandboxSpec(id="twin", memory_mb=128))
    assert refused.value.code == "name_conflict"
    assert (await process_runtime.exec("twin", ["echo", "ok"])).stdout == "ok\n"


async def test_a_failed_start_leaves_nothing(make_process_runtime: Factory, cgroup_root: CgroupRoot) -> None:
    # An init that cannot run (no system directories, so no dynamic loader): bubblewrap sets up, then
    # its exec fails; the start must fail cleanly, with what bubblewrap said on its stderr.
    process_runtime = make_process_runtime(system_paths=())
    with pytest.raises(RuntimeFailure, match="did not start") as failed:
        await process_runtime.start(SandboxSpec(id="broken", memory_mb=64))
    assert "execvp" in str(failed.value)
    assert list(process_runtime.statedir.ids()) == []
    assert not cgroup_root.child("broken").exists()


async def test_the_init_reaps_orphans_and_only_the_host_ends_it(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="keeper", memory_mb=64))
    record = process_runtime.statedir.load("keeper")
    assert isinstance(record, Running)
    # Orphans (double-forked children that exit) become the init's, and it reaps them.
    await process_runtime.exec("keeper", ["sh", "-c", "for i in 1 2 3 4 5; do (true &) ; done; sleep 0.2"])
    states = await process_runtime.exec("keeper", ["ps", "-e", "-o", "stat="])
    assert states.exit_code == 0 and not [s for s in states.stdout.split() if s.startswith("Z")], states
    # A tenant's signals to pid 1 do not end its sandbox; the host's SIGTERM does.
    await process_runtime.exec("keeper", ["sh", "-c", "kill -TERM 1; kill -KILL 1; kill -INT 1"])
    assert (await process_runtime.exec("keeper", ["echo", "alive"])).stdout == "alive\n"
    os.kill(record.init.pid, 15)
    deadline = asyncio.get_running_loop().time() + 10
    while not _gone(record.init.pid):
        assert asyncio.get_running_loop().time() < deadline, "the init outlived the host's SIGTERM"
        await asyncio.sleep(0.01)
    assert await process_runtime.list() == []


async def test_unknown_sandbox(process_runtime: ProcessRuntime) -> None:
    for call in (
        process_runtime.stop("nope"),
        process_runtime.resident_mb("nope"),
        process_runtime.exec("nope", ["true"]),
    ):
        with pytest.raises(SandboxNotFound):
            await call


@pytest.mark.parametrize("yields", [0, 1, 3, 10])
async def test_a_cancelled_start_leaves_nothing(
    process_runtime: ProcessRuntime, cgroup_root: CgroupRoot, yields: int
) -> None:
    task = asyncio.create_task(process_runtime.start(SandboxSpec(id="cancelled", memory_mb=64)))
    for _ in range(yields):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert list(process_runtime.statedir.ids()) == []
    assert not cgroup_root.child("cancelled").exists()
    # The id is free again.
    await process_runtime.start(SandboxSpec(id="cancelled", memory_mb=64))


_START_AND_EXIT = """
import asyncio, sys
from pathlib import Path
from corral.runtime.base import SandboxSpec
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.process import ProcessRuntime

root, cgroup_path, version = sys.argv[1], sys.argv[2], int(sys.argv[3])
runtime = ProcessRuntime(Path(root), cgroup_root=CgroupRoot(Path(cgroup_path), version))
asyncio.run(runtime.start(SandboxSpec(id="survivor", memory_mb=64, hostname="before-restart")))
"""


async def test_sandboxes_survive_the_agent_process_and_are_readopted(
    make_process_runtime: Factory, cgroup_root: CgroupRoot, tmp_path: Path
) -> None:
    root = tmp_path / "sandboxes"
    # An agent process starts a sandbox and exits (as a crash or an upgrade would end it).
    done = subprocess.run(
        [sys.executable, "-c", _START_AND_EXIT, str(root), str(cgroup_root.path), str(cgroup_root.version)],
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    # The next agent finds it running and can use and stop it.
    process_runtime = make_process_runtime(root)
    assert [h.id for h in await process_runtime.list()] == ["survivor"]
    result = await process_runtime.exec("survivor", ["hostname"])
    assert result.stdout == "before-restart\n"
    record = process_runtime.statedir.load("survivor")
    assert isinstance(record, Running)
    await process_runtime.stop("survivor")
    assert _gone(record.init.pid) and _gone(record.monitor.pid)
    assert not cgroup_root.child("survivor").exists()


async def test_an_agent_cleans_up_a_sandbox_that_died_on_its_own(
    process_runtime: ProcessRuntime, eventually: Callable[..., Awaitable[bool]]
) -> None:
    from corral.agent import Agent, AgentConfig
    from corral.agent.protocol import StartSandbox

    agent = Agent(AgentConfig("h", 4096, 2.0), process_runtime)
    await agent.start(StartSandbox(id="killed", memory_mb=96))
    record = process_runtime.statedir.load("killed")
    assert isinstance(record, Running) and record.cgroup is not None
    os.kill(record.init.pid, 9)  # as `kill -KILL -1` inside it does, or the OOM killer

    async def measured_gone() -> bool:
        await agent.measure()
        return "killed" not in agent.sandbox_ids()

    assert await eventually(measured_gone)

    async def torn_down() -> bool:  # in the background, not inside the reading
        return not process_runtime.statedir.dir("killed").exists()

    # Its record, cgroups and host uid went with it, with no listing or delete to ask for them.
    assert await eventually(torn_down)
    assert not Path(record.cgroup).exists()
    assert not any(Path(p).exists() for p in record.cgroup_extra)
