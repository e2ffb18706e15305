"""Memory: the reading follows what the sandbox touches, and the configured limit holds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from corral.runtime.base import SandboxSpec
from corral.runtime.process import ProcessRuntime

pytestmark = pytest.mark.process

Eventually = Callable[..., Awaitable[bool]]

# Touches every page (b"x" * n writes them; bytearray(n) would not), then holds them until killed.
_HOLD = "import time; held = b'x' * ({mb} << 20); open('/tmp/ready', 'w').close(); time.sleep(600)"


async def _follows_allocation(
    process_runtime: ProcessRuntime, sandbox_id: str, eventually: Eventually
) -> None:
    before = await process_runtime.resident_mb(sandbox_id)
    assert before is not None and before < 60
    started = await process_runtime.exec(
        sandbox_id, ["sh", "-c", f'python3 -c "{_HOLD.format(mb=120)}" >/dev/null 2>&1 &']
    )
    assert started.exit_code == 0, started.stderr

    async def grown() -> bool:
        now = await process_runtime.resident_mb(sandbox_id)
        return now is not None and now >= before + 110

    assert await eventually(grown), await process_runtime.resident_mb(sandbox_id)
    killed = await process_runtime.exec(sandbox_id, ["pkill", "-f", "held"])
    assert killed.exit_code == 0, killed.stderr

    async def shrunk() -> bool:
        now = await process_runtime.resident_mb(sandbox_id)
        return now is not None and now < before + 60

    assert await eventually(shrunk), await process_runtime.resident_mb(sandbox_id)


async def test_reading_follows_an_allocation_cgroup(
    process_runtime: ProcessRuntime, eventually: Eventually
) -> None:
    await process_runtime.start(SandboxSpec(id="grow", memory_mb=512))
    await _follows_allocation(process_runtime, "grow", eventually)


async def test_reading_follows_an_allocation_proc(
    make_process_runtime: Callable[..., ProcessRuntime], eventually: Eventually
) -> None:
    # No writable cgroup: the reading comes from /proc (the sandbox's pid namespace).
    process_runtime = make_process_runtime(cgroup_root=None)
    handle = await process_runtime.start(SandboxSpec(id="grow-proc", memory_mb=512))
    assert "cgroup" not in handle.ref
    await _follows_allocation(process_runtime, "grow-proc", eventually)


async def test_memory_limit_is_enforced(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="small", memory_mb=64))
    over = await process_runtime.exec("small", ["python3", "-c", "x = b'x' * (200 << 20); print('survived')"])
    assert over.exit_code == 137  # SIGKILL from the cgroup's OOM killer
    assert "survived" not in over.stdout
    resident = await process_runtime.resident_mb("small")
    assert resident is not None and resident <= 64
    # Only the offender died: the sandbox is still there and usable.
    assert (await process_runtime.exec("small", ["echo", "still here"])).stdout.strip() == "still here"
    under = await process_runtime.exec("small", ["python3", "-c", "x = b'x' * (20 << 20); print('fits')"])
    assert under.stdout.strip() == "fits", under.stderr


async def test_files_count_against_the_limit(process_runtime: ProcessRuntime) -> None:
    # /tmp and home are tmpfs charged to the sandbox: filling them cannot exceed the limit.
    await process_runtime.start(SandboxSpec(id="disk", memory_mb=64))
    filled = await process_runtime.exec("disk", ["sh", "-c", "head -c 200M /dev/zero > /tmp/big; echo $?"])
    assert filled.exit_code != 0 or filled.stdout.strip() != "0"
    resident = await process_runtime.resident_mb("disk")
    assert resident is not None and resident <= 64
