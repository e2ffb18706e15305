"""Fixtures for the process runtime: every sandbox, cgroup and state directory a test creates is torn
down even when the test fails, and the session ends by checking that nothing was left behind."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.runtime.cgroups import CgroupRoot, detect
from corral.runtime.process import ProcessRuntime


@pytest.fixture(scope="session")
def cgroup_root() -> Iterator[CgroupRoot]:
    """One memory-cgroup root for the session, unique so parallel runs never share one."""
    root = detect(f"corral-test-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    assert root is not None, "these machines have a writable memory cgroup; the tests need it"
    yield root
    leftovers = sorted({p.name for d in (root.path, *root.extra) for p in d.iterdir() if p.is_dir()})
    for name in leftovers:
        root.child(name).remove()
    assert root.remove_if_empty(), f"could not remove {root.path}"
    assert not leftovers, f"sandbox cgroups left behind: {leftovers}"


async def _stop_all(process_runtime: ProcessRuntime) -> list[str]:
    left = [handle.id for handle in await process_runtime.list()]
    for sandbox_id in left:
        await process_runtime.stop(sandbox_id)
    return left


class RuntimeFactory:
    """Builds runtimes over a test's state root (or another), remembering them for teardown."""

    def __init__(self, root: Path, cgroups: CgroupRoot) -> None:
        self.root = root
        self.cgroups = cgroups
        self.made: list[ProcessRuntime] = []

    def __call__(self, root: Path | None = None, **kwargs: Any) -> ProcessRuntime:
        kwargs.setdefault("cgroup_root", self.cgroups)
        process_runtime = ProcessRuntime(root or self.root, **kwargs)
        self.made.append(process_runtime)
        return process_runtime


@pytest.fixture
async def make_process_runtime(tmp_path: Path, cgroup_root: CgroupRoot) -> AsyncIterator[RuntimeFactory]:
    factory = RuntimeFactory(tmp_path / "sandboxes", cgroup_root)
    yield factory
    for made in factory.made:
        await _stop_all(made)
        await made.drain_disks()  # the pool's ready disks are mounted: none outlives its test
        assert not any(made.statedir.ids()), f"state left in {made.statedir.root}"
    for directory in (cgroup_root.path, *cgroup_root.extra):
        assert not [p for p in directory.iterdir() if p.is_dir()], "a sandbox cgroup outlived its test"


@pytest.fixture
async def process_runtime(make_process_runtime: RuntimeFactory) -> ProcessRuntime:
    return make_process_runtime()


Probe = Callable[[], Awaitable[bool]]


async def _eventually(probe: Probe, *, within_s: float = 20.0, every_s: float = 0.05) -> bool:
    """Poll until ``probe`` holds; the bound only stops a broken test from hanging."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while loop.time() < deadline:
        if await probe():
            return True
        await asyncio.sleep(every_s)
    return await probe()


@pytest.fixture
def eventually() -> Callable[..., Awaitable[bool]]:
    return _eventually
