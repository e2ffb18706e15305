"""What every test gets: the root logger as it found it. A test that runs a server's own start-up
routes every logger to the stderr pytest captured for that test; left in place, the next test's log
records would be written to a closed stream (a "Logging error" in whatever stderr that test reads).

And what the run leaves behind: no network slot of its agents' on the host."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.agent import netns
from corral.agent.netslots import reclaim_under


@pytest.fixture(autouse=True)
def _root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    for handler in handlers:
        if handler not in root.handlers:
            root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session", autouse=True)
def _nothing_of_the_run_outlives_it(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Agents the tests stop or kill (kill -9 is a scenario here) leave their sandboxes running, as
    an agent does so that its next start re-adopts them, and cannot close their slot pools; their
    state stays in pytest's kept temporary directories, where nothing would ever take them back. At
    its end the run stops every sandbox recorded under its own directory, then removes every network
    slot leased there."""
    yield
    base = tmp_path_factory.getbasetemp()
    if os.geteuid() != 0:
        return
    asyncio.run(_stop_sandboxes_under(base))
    if not netns.tools_missing():
        reclaim_under(base)


async def _stop_sandboxes_under(base: Path) -> None:
    from corral.runtime.process import ProcessRuntime
    from corral.runtime.statedir import MARKER, RECORD

    roots = {p.parent.parent for name in (RECORD, MARKER) for p in base.glob(f"**/{name}")}
    for root in sorted(roots):
        runtime = ProcessRuntime(root=root)
        for sandbox_id in list(runtime.statedir.ids()):
            with contextlib.suppress(Exception):
                await runtime.stop(sandbox_id)
