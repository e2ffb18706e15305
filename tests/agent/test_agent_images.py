"""A host's images through its agent: creates of an image the host lacks wait on one fetch, every live
sandbox of an image holds it against eviction (adopted ones too, after a restart), a host that cannot
have the image refuses with a code placement tries elsewhere on, heartbeats name what the host holds,
and warm targets' images are fetched ahead."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from corral.agent import Agent, StartSandbox
from corral.agent.errors import AgentRefusal
from corral.agent.protocol import WarmTarget
from corral.core import ManualClock
from corral.images import DirBlobStore, digest_file
from corral.images.cache import ImageCache
from corral.runtime.sim import SimRuntime, SimState

SIZE = 200_000


class Counted:
    def __init__(self, root: Path) -> None:
        self.blobs = DirBlobStore(root)
        self.reads: Counter[str] = Counter()

    async def add(self, tmp: Path) -> str:
        src = tmp / os.urandom(4).hex()
        src.write_bytes(os.urandom(SIZE))
        digest = digest_file(src)
        await self.blobs.put(digest, src)
        return digest

    async def read(self, digest: str) -> AsyncIterator[bytes]:
        self.reads[digest] += 1
        await asyncio.sleep(0.02)  # a transfer takes a while: the creates pile up behind it
        async for chunk in self.blobs.read(digest):
            yield chunk


@pytest.fixture
def source(tmp_path: Path) -> Counted:
    return Counted(tmp_path / "control-plane")


def _agent(
    make_agent: Callable[..., Agent], tmp_path: Path, source: Counted, budget: int, **kw: object
) -> Agent:
    cache = ImageCache(tmp_path / "host-images", source, budget, retry_base_s=0.001)
    return make_agent(images=cache, max_concurrent_starts=32, **kw)


async def test_twenty_concurrent_creates_of_a_missing_image_fetch_it_once(
    make_agent: Callable[..., Agent], tmp_path: Path, source: Counted
) -> None:
    digest = await source.add(tmp_path)
    agent = _agent(make_agent, tmp_path, source, 10 * SIZE)
    assert agent.heartbeat().images == []
    infos = await asyncio.gather(
        *(agent.start(StartSandbox(id=f"sb-{i}", memory_mb=256, image=digest)) for i in range(20))
    )
    assert len(infos) == 20 and source.reads[digest] == 1
    assert agent.images is not None and agent.images.users(digest) == 20
    assert agent.heartbeat().images == [digest]
    for i in range(20):
        await agent.stop(f"sb-{i}")
    assert agent.images.users(digest) == 0 and agent.images.has(digest)


async def test_a_live_sandbox_keeps_its_image_from_eviction_across_a_restart(
    make_agent: Callable[..., Agent], tmp_path: Path, source: Counted, clock: ManualClock, sim_state: SimState
) -> None:
    a, b = await source.add(tmp_path), await source.add(tmp_path)
    before = _agent(make_agent, tmp_path, source, int(1.5 * SIZE))  # room for one image
    await before.start(StartSandbox(id="uses-a", memory_mb=256, image=a))
    del before  # the agent dies; its sandboxes and its disk do not

    after = _agent(
        make_agent,
        tmp_path,
        source,
        int(1.5 * SIZE),
        runtime=SimRuntime(clock, random.Random(9), state=sim_state),
    )
    assert await after.adopt() == 1
    assert after.images is not None and after.images.users(a) == 1
    await after.start(StartSandbox(id="uses-b", memory_mb=256, image=b))
    assert set(after.heartbeat().images) == {a, b}  # over budget, but both are in use
    await after.stop("uses-a")
    assert after.heartbeat().images == [b] and not after.images.path(a).exists()
    assert source.reads == Counter({a: 1, b: 1})


async def test_a_host_that_cannot_have_the_image_refuses_for_placement_to_try_another(
    make_agent: Callable[..., Agent], tmp_path: Path, source: Counted
) -> None:
    agent = _agent(make_agent, tmp_path, source, 10 * SIZE)
    with pytest.raises(AgentRefusal) as refused:
        await agent.start(StartSandbox(id="sb", memory_mb=256, image="sha256:" + "0" * 64))
    assert refused.value.code == "image_unavailable" and refused.value.status == 503
    assert agent.list() == [] and agent.pending_mb == 0


async def test_warm_targets_fetch_their_image_ahead(
    make_agent: Callable[..., Agent], tmp_path: Path, source: Counted
) -> None:
    digest = await source.add(tmp_path)
    agent = _agent(make_agent, tmp_path, source, 10 * SIZE)
    agent.set_warm_targets([WarmTarget(template="py", target=2, memory_mb=256, image=digest)])
    for _ in range(100):
        await asyncio.sleep(0.01)
        if agent.images is not None and agent.images.has(digest):
            break
    assert agent.heartbeat().images == [digest] and source.reads[digest] == 1
    assert agent.replenish() == 2
    for _ in range(100):
        await asyncio.sleep(0.01)
        if agent.warm.ready_count("py") == 2:
            break
    assert {i.role for i in agent.list()} == {"warm"} and len(agent.list()) == 2
    assert agent.images is not None and agent.images.users(digest) == 2 and source.reads[digest] == 1
