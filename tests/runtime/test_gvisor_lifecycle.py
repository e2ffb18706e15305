"""The gvisor runtime's sandboxes end whole: one whose Sentry dies is found no more (so that its agent
reports it stopped) and its stop leaves nothing; a stop ends the host's ``runsc exec`` of a command
nobody reads; the sandbox user's home is its own to write."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.runtime.base import SandboxNotFound, SandboxSpec
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.gvisor import GvisorRuntime, unavailable_reason

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(unavailable_reason() is not None, reason=f"gvisor: {unavailable_reason()}"),
]


@pytest.fixture
async def gvisor(tmp_path: Path, cgroup_root: CgroupRoot) -> AsyncIterator[GvisorRuntime]:
    runtime = GvisorRuntime(tmp_path / "gvisor", cgroup_root=cgroup_root, cgroup_prefix="lc-")
    yield runtime
    for sandbox in (tmp_path / "gvisor" / "sandboxes").glob("*"):
        await runtime.stop(sandbox.name)
    assert not list((tmp_path / "gvisor" / "sandboxes").glob("*"))


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_sandbox_whose_sentry_dies_is_found_no_more_and_its_stop_leaves_nothing(
    gvisor: GvisorRuntime,
) -> None:
    await gvisor.start(SandboxSpec(id="dies", memory_mb=128))
    assert await gvisor.resident_mb("dies") is not None
    pids = gvisor.host_pids("dies")
    sentry = [p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"runsc-sandbox")]
    assert len(sentry) == 1, pids
    os.kill(sentry[0], signal.SIGKILL)  # the OOM killer's choice, or an operator's
    for _ in range(100):
        if not gvisor.host_pids("dies"):
            break
        await asyncio.sleep(0.05)
    with pytest.raises(SandboxNotFound):
        await gvisor.resident_mb("dies")  # what an agent's measuring sees: it reports it stopped
    with pytest.raises(SandboxNotFound):
        await gvisor.exec("dies", ["true"])
    assert [h.id for h in await gvisor.list()] == []
    cgroup = gvisor._cgroup("dies")
    assert cgroup is not None
    await gvisor.stop("dies")
    assert not cgroup.exists() and not any(p.exists() for p in cgroup.extra)
    assert not (gvisor.root / "sandboxes" / "dies").exists()
    assert not [p for p in (gvisor.root / "runsc").iterdir() if "dies" in p.name]


async def test_a_stop_ends_the_host_side_of_a_command_nobody_reads(gvisor: GvisorRuntime) -> None:
    await gvisor.start(SandboxSpec(id="unread", memory_mb=128))
    spawned = await gvisor.spawn("unread", ["cat", "/dev/zero"])
    await asyncio.sleep(0.5)  # its pipe fills; nothing reads it
    runsc_exec = list(gvisor._execs["unread"])
    assert len(runsc_exec) == 1 and _alive(runsc_exec[0].pid)
    await gvisor.stop("unread")
    assert await asyncio.wait_for(spawned.wait(), 10) != 0
    assert not _alive(runsc_exec[0].pid)

    async def drained(stream: asyncio.StreamReader) -> None:
        while await stream.read(1 << 20):
            pass

    # And its output ends: no one else (the Sentry least of all) holds the pipes open.
    await asyncio.wait_for(asyncio.gather(drained(spawned.stdout), drained(spawned.stderr)), 10)


async def test_the_home_is_the_sandbox_user_s_own(gvisor: GvisorRuntime) -> None:
    await gvisor.start(SandboxSpec(id="home", memory_mb=128))
    wrote = await gvisor.exec("home", ["sh", "-c", "echo mine > ~/note && cat ~/note && id -u"])
    assert (wrote.exit_code, wrote.stdout) == (0, "mine\n1000\n"), wrote
    await gvisor.stop("home")
