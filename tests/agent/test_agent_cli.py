"""``corral agent``: argument handling, and one real run on loopback against a stub control plane."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import httpx
import pytest
import typer
from typer.testing import CliRunner

from corral.agent import Heartbeat, HttpAgentClient, StartSandbox
from corral.agent.cli import agent_command, parse_listen

APP = typer.Typer()
APP.command()(agent_command)
LAUNCH = (
    "import typer; from corral.agent.cli import agent_command; "
    "app = typer.Typer(); app.command()(agent_command); app()"
)


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:7070") == ("127.0.0.1", 7070)
    assert parse_listen("[::1]:80") == ("::1", 80)
    for bad in ["7070", "host:", ":80", "host:port", "host:70000"]:
        with pytest.raises(typer.BadParameter):
            parse_listen(bad)


def test_token_is_required_and_read_from_the_environment() -> None:
    runner = CliRunner()
    base = ["--control-plane", "http://127.0.0.1:1", "--id", "a"]
    result = runner.invoke(APP, base, env={"CORRAL_AGENT_TOKEN": ""})
    assert result.exit_code != 0
    result = runner.invoke(APP, [*base, "--runtime", "vm"], env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0 and "unknown runtime" in result.output
    result = runner.invoke(APP, [*base, "--listen", "nowhere"], env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0 and "HOST:PORT" in result.output
    result = runner.invoke(APP, [*base, "--admission", "optimistic"], env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0


class _ControlPlane(BaseHTTPRequestHandler):
    beats: ClassVar[list[tuple[str, Heartbeat]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/agent/heartbeat":
            self.beats.append((self.headers["Authorization"], Heartbeat.model_validate(json.loads(body))))
            self.send_response(204)
        else:
            self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def control_plane() -> Iterator[tuple[str, list[tuple[str, Heartbeat]]]]:
    _ControlPlane.beats = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ControlPlane)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _ControlPlane.beats
    server.shutdown()
    server.server_close()


def _wait_for(predicate: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


@pytest.mark.slow
async def test_agent_command_serves_and_heartbeats(
    control_plane: tuple[str, list[tuple[str, Heartbeat]]], tmp_path: Path
) -> None:
    url, beats = control_plane
    env = {**os.environ, "CORRAL_AGENT_TOKEN": "e2e-token"}
    args = ["--control-plane", url, "--id", "e2e", "--listen", "127.0.0.1:0", "--memory-mb", "8192"]
    args += [
        "--cpus",
        "2",
        "--heartbeat-interval",
        "0.1",
        "--admission",
        "committed",
        "--headroom-mb",
        "1024",
    ]
    log = (tmp_path / "agent.log").open("w")
    proc = subprocess.Popen([sys.executable, "-c", LAUNCH, *args], env=env, stderr=log)
    client: HttpAgentClient | None = None
    try:
        _wait_for(lambda: len(beats) >= 1 or proc.poll() is not None, "a first heartbeat")
        assert proc.poll() is None, (tmp_path / "agent.log").read_text()
        auth, first = beats[0]
        assert auth == "Bearer e2e-token"
        # Asked for port 0, the agent publishes the port it actually got.
        assert first.address.startswith("http://127.0.0.1:") and not first.address.endswith(":0")
        assert (first.agent_id, first.runtime) == ("e2e", "sim")
        client = HttpAgentClient(first.address, "e2e-token")
        assert first.memory_mb_total == 8192 and first.memory_mb_admittable == 8192 - 1024

        # Heartbeats start only once the API is listening, so the address works at once.
        info = await client.start(StartSandbox(id="sb-1", memory_mb=1024))
        assert info.id == "sb-1"
        _wait_for(lambda: "sb-1" in beats[-1][1].sandbox_ids, "a heartbeat that accounts for the sandbox")
        hb = beats[-1][1]
        assert hb.memory_mb_admittable == 8192 - 1024 - 1024
        seqs = [b.seq for _, b in beats]
        assert seqs == sorted(set(seqs))
        async with httpx.AsyncClient() as raw:
            assert (await raw.get(f"{first.address}/v1/capacity")).status_code == 401
    finally:
        if client is not None:
            await client.aclose()
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        log.close()
        assert "Traceback" not in (tmp_path / "agent.log").read_text()
