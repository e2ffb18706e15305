"""What the network-slot tests share: the lab (corral.testing.netlab), a pool's teardown, the
runtime set up after the pool, and a sandbox started in a slot taken for it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from corral.agent import netns
from corral.agent.netslots import SlotPool
from corral.core.netpolicy import EgressPolicy, SlotNet
from corral.runtime.base import SandboxSpec
from corral.runtime.process import ProcessRuntime
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


@pytest.fixture
def runtime(pool: SlotPool, make_process_runtime: RuntimeFactory) -> ProcessRuntime:
    """Set up after the pool, so its sandboxes are stopped before the pool takes its slots back."""
    return make_process_runtime()


async def started(runtime: ProcessRuntime, pool: SlotPool, sandbox_id: str, policy: EgressPolicy) -> SlotNet:
    """A sandbox in a slot taken for it, its nameserver the slot's resolver when the pool has one."""
    slot = await pool.take(sandbox_id, policy)
    nameserver = str(slot.host_ip) if pool.resolver is not None else None
    spec = SandboxSpec(id=sandbox_id, memory_mb=128, netns=netns.netns_path(slot), nameserver=nameserver)
    await runtime.start(spec)
    return slot
