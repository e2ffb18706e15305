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

from corral.agent import AgentHeartbeat, HttpAgentClient, StartSandbox
from corral.agent.cli import agent_command, parse_listen
from corral.client.credentials import write_private

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


def test_credentials_are_required_and_the_shared_token_only_in_development_mode(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["--control-plane", "http://127.0.0.1:1", "--id", "a"]
    result = runner.invoke(APP, base, env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0 and "--token-file" in result.output
    result = runner.invoke(APP, [*base, "--dev-shared-token"], env={"CORRAL_AGENT_TOKEN": ""})
    assert result.exit_code != 0 and "CORRAL_AGENT_TOKEN" in result.output
    # A credentials file others can read is refused, as ssh refuses such a private key.
    creds = tmp_path / "a.json"
    creds.write_text(json.dumps({"host_id": "a", "agent_token": "t" * 20, "host_key": "k" * 20}))
    creds.chmod(0o644)
    result = runner.invoke(APP, [*base, "--token-file", str(creds)])
    assert result.exit_code != 0 and "readable by others" in result.output
    creds.chmod(0o600)
    result = runner.invoke(APP, ["--control-plane", "http://x:1", "--id", "b", "--token-file", str(creds)])
    assert result.exit_code != 0 and "credentials are for a" in result.output
    base = [*base, "--dev-shared-token"]
    result = runner.invoke(APP, [*base, "--runtime", "qemu"], env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0 and "unknown runtime" in result.output
    result = runner.invoke(APP, [*base, "--listen", "nowhere"], env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0 and "HOST:PORT" in result.output
    result = runner.invoke(APP, [*base, "--admission", "optimistic"], env={"CORRAL_AGENT_TOKEN": "t"})
    assert result.exit_code != 0


class _ControlPlane(BaseHTTPRequestHandler):
    beats: ClassVar[list[tuple[str, AgentHeartbeat]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/v1/agent/heartbeat":
            self.beats.append(
                (self.headers["Authorization"], AgentHeartbeat.model_validate(json.loads(body)))
            )
            self.send_response(204)
        else:
            self.send_response(404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def control_plane() -> Iterator[tuple[str, list[tuple[str, AgentHeartbeat]]]]:
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
    control_plane: tuple[str, list[tuple[str, AgentHeartbeat]]], tmp_path: Path
) -> None:
    url, beats = control_plane
    creds = tmp_path / "e2e.json"
    write_private(
        creds,
        json.dumps(
            {"host_id": "e2e", "agent_token": "e2e-agent-token-0123", "host_key": "e2e-host-key-0123"}
        ),
    )
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_AGENT_TOKEN"}
    args = [
        "--control-plane",
        url,
        "--token-file",
        str(creds),
        "--listen",
        "127.0.0.1:0",
        "--memory-mb",
        "8192",
    ]
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
        assert auth == "Bearer e2e-agent-token-0123"
        # Asked for port 0, the agent publishes the port it actually got.
        assert first.address.startswith("http://127.0.0.1:") and not first.address.endswith(":0")
        assert (first.agent_id, first.runtime) == ("e2e", "sim")
        client = HttpAgentClient(first.address, "e2e-host-key-0123")
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
            # The agent's own token opens nothing on it: callers need the host key.
            as_agent = {"Authorization": "Bearer e2e-agent-token-0123"}
            assert (await raw.get(f"{first.address}/v1/capacity", headers=as_agent)).status_code == 401
    finally:
        if client is not None:
            await client.aclose()
        proc.send_signal(signal.SIGTERM)
        # uvicorn shuts down gracefully, then re-raises the signal it caught.
        assert proc.wait(timeout=30) in (0, -signal.SIGTERM)
        log.close()
        assert "Traceback" not in (tmp_path / "agent.log").read_text()
