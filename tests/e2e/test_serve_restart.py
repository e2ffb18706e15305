"""Restarting ``corral serve`` is not a reset: the admin token it made is kept (0600, beside the
store) and still works; ``--keep-sandboxes`` leaves sandboxes running for the next start to re-adopt;
without it they are stopped at shutdown and their records say so at once, never ``running``."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import stat
from pathlib import Path

import httpx
import pytest

from corral.runtime.process import unavailable_reason

from .procs import Proc, free_port, serve_process_args, start, wait_ready

pytestmark = pytest.mark.process


def _serve(tmp: Path, port: int, name: str, *extra: str) -> Proc:
    proc = start(name, [*serve_process_args(port, tmp, hosts=1), *extra], tmp)
    wait_ready(proc, f"http://127.0.0.1:{port}")
    return proc


def _interrupt(proc: Proc) -> str:
    """Ctrl-C, as a user stops it; what it printed."""
    proc.popen.send_signal(signal.SIGINT)
    proc.popen.wait(20)
    return proc.log.read_text()


def _recorded_state(db: Path, sandbox_id: str) -> str:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT state FROM sandboxes WHERE id = ?", (sandbox_id,)).fetchone()
    return str(row[0])


def test_a_restart_keeps_the_token_and_tells_the_truth_about_sandboxes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert unavailable_reason() is None
    monkeypatch.delenv("CORRAL_TOKEN", raising=False)
    port = free_port()
    token_file = tmp_path / "corral.admin-token"
    first = _serve(tmp_path, port, "serve-1", "--keep-sandboxes")
    try:
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert token in first.log.read_text() and str(token_file) in first.log.read_text()
        admin = httpx.Client(base_url=first.url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        kept, died = (admin.post("/v1/sandboxes", json={"memory_mb": 128}).json()["id"] for _ in range(2))
        assert "left 2 sandboxes running" in _interrupt(first)
    finally:
        first.stop()
    # One of the two dies while no server runs (a crash, a reboot would take both).
    record = json.loads(next(tmp_path.glob(f"state/*/{died}/sandbox.json")).read_text())
    os.kill(int(record["init"]["pid"]), signal.SIGKILL)

    second = _serve(tmp_path, port, "serve-2")
    try:
        assert token not in second.log.read_text(), "the token is printed once, on the start that made it"
        # The old token still works; the sandbox left running was re-adopted, and the one that died
        # is stopped from the first request on, never shown running.
        got = admin.get(f"/v1/sandboxes/{kept}")
        assert got.status_code == 200 and got.json()["state"] == "running", got.text
        assert admin.get(f"/v1/sandboxes/{died}").json()["state"] == "stopped"
        ex = admin.post(f"/v1/sandboxes/{kept}/exec", json={"command": ["echo", "still here"]})
        assert ex.json()["stdout"] == "still here\n"
        assert "stopped 1 sandbox " in _interrupt(second)
    finally:
        second.stop()
        admin.close()
    # Stopped at shutdown (without --keep-sandboxes): its record says so, not `running`.
    assert _recorded_state(tmp_path / "corral.db", kept) == "stopped"
