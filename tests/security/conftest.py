"""Attacks through the public API. The in-process cluster of the control-plane tests serves the input
attacks (fast, exact); the identity attacks run against real ``corral api`` and ``corral agent``
processes (see ``tests.e2e.procs``).

The attacks on sandboxes run on each runtime through one seam, the module-scoped ``runtime_name``
fixture: a module's tests run on ``process``, then on ``gvisor``. gVisor's cases are the slower half:
those of tests marked ``gvisor_subset`` run in ``make test``; the rest carry ``gvisor_full`` and run
only when ``CORRAL_SECURITY_GVISOR=all`` (``make security-gvisor``). A module whose attack has no
counterpart on gVisor says why with ``process_only(reason)``: its gVisor cases are skipped with it."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from corral.runtime.base import Runtime
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.gvisor import GvisorRuntime
from tests.control.conftest import ADMIN, Cluster, cluster
from tests.runtime.conftest import RuntimeFactory, cgroup_root, make_process_runtime

from .runtime_serve import RUNTIMES, Serve, running_serve

__all__ = ["ADMIN", "Cluster", "cgroup_root", "cluster", "make_process_runtime"]

WHOLE_GVISOR_HALF = "CORRAL_SECURITY_GVISOR"


@pytest.fixture(scope="module", params=RUNTIMES)
def runtime_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def sandbox_runtime(
    runtime_name: str, make_process_runtime: RuntimeFactory, tmp_path: Path, cgroup_root: CgroupRoot
) -> AsyncIterator[Runtime]:
    """The runtime itself, for the attacks on an agent's side of it: every sandbox it made is stopped
    at the end, and nothing of them is left (state, cgroups)."""
    if runtime_name == "process":
        yield make_process_runtime()  # its factory checks what is left
        return
    runtime = GvisorRuntime(tmp_path / "gvisor", cgroup_root=cgroup_root, cgroup_prefix="sec-")
    yield runtime
    for handle in await runtime.list():
        await runtime.stop(handle.id)
    for sandbox in (tmp_path / "gvisor" / "sandboxes").glob("*"):
        await runtime.stop(sandbox.name)  # ended on its own: listed no more, not yet torn down
    assert not [p for d in (cgroup_root.path, *cgroup_root.extra) for p in d.glob("sec-gv-*")]


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory, runtime_name: str) -> Iterator[Serve]:
    yield from running_serve(tmp_path_factory, runtime=runtime_name)


def _on_gvisor(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    return callspec is not None and callspec.params.get("runtime_name") == "gvisor"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    whole = os.environ.get(WHOLE_GVISOR_HALF) == "all"
    kept, dropped = [], []
    for item in items:
        if not _on_gvisor(item):
            kept.append(item)
            continue
        only = item.get_closest_marker("process_only")
        if only is not None:
            item.add_marker(pytest.mark.skip(reason=f"not on gvisor: {only.args[0]}"))
        elif item.get_closest_marker("gvisor_subset") is None:
            item.add_marker(pytest.mark.gvisor_full)
            if not whole:
                dropped.append(item)
                continue
        kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
