"""A replica's bounds reach it from the command line: what ``corral serve`` and ``corral api`` hand
the server is what the operator typed (the server's own start is replaced by a recorder)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from corral.api import server
from corral.cli import app
from corral.core.inflight import DEFAULT_PORT_REQUESTS_PER_SANDBOX


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []

    async def record(opts: Any, *_: Any) -> None:
        seen.append(opts)

    monkeypatch.setattr(server, "serve", record)
    monkeypatch.setattr(server, "api", record)
    return seen


@pytest.mark.parametrize("command", ["serve", "api"])
def test_the_port_request_bound_per_sandbox_is_the_operators(
    tmp_path: Path, command: str, started: list[Any]
) -> None:
    base = [command, "--store", f"sqlite:///{tmp_path / 'corral.db'}", "--port", "0"]
    env = {**os.environ, "CORRAL_TOKEN": "t" * 32}
    out = CliRunner().invoke(app, [*base, "--max-port-requests-per-sandbox", "4096"], env=env)
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, base, env=env)
    assert out.exit_code == 0, out.output
    assert [o.max_port_requests_per_sandbox for o in started] == [4096, DEFAULT_PORT_REQUESTS_PER_SANDBOX]
    out = CliRunner().invoke(app, [*base, "--max-port-requests-per-sandbox", "0"], env=env)
    assert out.exit_code != 0 and len(started) == 2  # refused before anything starts
