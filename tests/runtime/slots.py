"""What the network-slot tests share: the lab (corral.testing.netlab), a pool's teardown, the
runtime set up after the pool, and a sandbox started in a slot taken for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.agent import netns
from corral.agent.netslots import SlotPool
from corral.core.netpolicy import EgressPolicy, SlotNet
from corral.runtime.base import Runtime, SandboxSpec
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.gvisor import GvisorRuntime
from corral.runtime.gvisor import unavailable_reason as gvisor_unavailable
from corral.testing import netlab
from tests.runtime.conftest import RuntimeFactory


@pytest.fixture
def lab() -> Iterator[netlab.Lab]:
    with netlab.internet() as made:
        yield made


async def emptied(pool: SlotPool) -> AsyncIterator[SlotPool]:
    """A pool fixture's body: ``pool``, then every slot given back and the pool closed."""
    yield pool
    for sandbox_id in list(pool.in_use):
        await pool.give_back(sandbox_id)
    await pool.close()


@pytest.fixture(params=["process"])
def slot_runtime(request: pytest.FixtureRequest) -> str:
    """Which runtime the slot's sandboxes run on: a test that holds on both says so with
    ``@pytest.mark.parametrize("slot_runtime", BOTH, indirect=True)``; a test of the hostile suite
    takes its ``runtime_name``."""
    if "runtime_name" in request.fixturenames:
        return str(request.getfixturevalue("runtime_name"))
    return str(request.param)


# Both runtimes, each with its reason to be skipped where it cannot run.
BOTH = [
    "process",
    pytest.param(
        "gvisor", marks=pytest.mark.skipif(gvisor_unavailable() is not None, reason=f"{gvisor_unavailable()}")
    ),
]


@pytest.fixture
async def runtime(
    pool: SlotPool,
    make_process_runtime: RuntimeFactory,
    slot_runtime: str,
    tmp_path: Path,
    cgroup_root: CgroupRoot,
) -> AsyncIterator[Runtime]:
    """Set up after the pool, so its sandboxes are stopped before the pool takes its slots back."""
    if slot_runtime == "process":
        yield make_process_runtime()  # its factory stops what is left and checks
        return
    gvisor = GvisorRuntime(tmp_path / "gvisor", cgroup_root=cgroup_root, cgroup_prefix="slot-")
    yield gvisor
    for sandbox in (tmp_path / "gvisor" / "sandboxes").glob("*"):
        await gvisor.stop(sandbox.name)


async def started(runtime: Runtime, pool: SlotPool, sandbox_id: str, policy: EgressPolicy) -> SlotNet:
    """A sandbox in a slot taken for it, its nameserver the slot's resolver when the pool has one."""
    slot = await pool.take(sandbox_id, policy)
    nameserver = str(slot.host_ip) if pool.resolver is not None else None
    spec = SandboxSpec(id=sandbox_id, memory_mb=128, netns=netns.netns_path(slot), nameserver=nameserver)
    await runtime.start(spec)
    return slot
