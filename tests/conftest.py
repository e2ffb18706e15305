"""What every test gets: the root logger as it found it. A test that runs a server's own start-up
routes every logger to the stderr pytest captured for that test; left in place, the next test's log
records would be written to a closed stream (a "Logging error" in whatever stderr that test reads).

And what the run leaves behind: no network slot of its agents' on the host."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator

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
def _no_network_slot_outlives_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Agents the tests kill (kill -9 is a scenario here) cannot close their slot pools, and their
    state stays in pytest's kept temporary directories, so no later pool would ever take those slots
    back: at its end the run removes every slot leased under its own directory."""
    yield
    if os.geteuid() == 0 and not netns.tools_missing():
        reclaim_under(tmp_path_factory.getbasetemp())
