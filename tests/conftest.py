"""What every test gets: the root logger as it found it. A test that runs a server's own start-up
routes every logger to the stderr pytest captured for that test; left in place, the next test's log
records would be written to a closed stream (a "Logging error" in whatever stderr that test reads)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest


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
