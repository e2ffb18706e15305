"""Real processes on loopback for end-to-end tests: start, wait until ready, stop, never leak."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from corral.client.credentials import write_private
from corral.shapes.hosts import HostCredentials

CORRAL = [sys.executable, "-m", "corral"]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[:2]
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def _quiet_ports() -> range:
    """Ports the kernel never hands out on its own: below its ephemeral range, or above it."""
    low, high = _ephemeral_range()
    below = range(max(1024, low - 12_000), low)
    above = range(high + 1, min(65536, high + 1 + 12_000))
    return max(below, above, key=len)


_QUIET = _quiet_ports()
_picked: set[int] = set()


def free_port() -> int:
    """A free port for a process of the test to listen on, from outside the kernel's ephemeral range:
    a port the kernel hands out (bind to 0) may be handed out again, to any outgoing connection made
    before the process that was meant to have it binds it (a replica, an agent started a second later).
    Where the ephemeral range leaves no room, any free port."""
    for _ in range(1_000 if len(_QUIET) >= 100 else 0):
        port = random.choice(_QUIET)
        if port in _picked:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _picked.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill9(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self, timeout: float = 10) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill9()

    def output(self) -> str:
        try:
            return self.log.read_text()[-4000:]
        except OSError:
            return ""


def serve_process_args(port: int, workdir: Path, *, hosts: int = 2, runtime: str = "process") -> list[str]:
    """``corral serve`` with real sandboxes on ``hosts`` local agents, its state under ``workdir``."""
    return [
        "serve",
        "--runtime",
        runtime,
        "--hosts",
        str(hosts),
        "--port",
        str(port),
        "--store",
        f"sqlite:///{workdir / 'corral.db'}",
        "--state-dir",
        str(workdir / "state"),
        "--heartbeat-interval",
        "0.5",
    ]


def start(name: str, args: Sequence[str], logdir: Path, env: dict[str, str] | None = None) -> Proc:
    log = logdir / f"{name}.log"
    full_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
    with open(log, "wb") as f:
        popen = subprocess.Popen([*CORRAL, *args], stdout=f, stderr=subprocess.STDOUT, env=full_env)
    return Proc(name, popen, log)


def wait_ready(proc: Proc, url: str, path: str = "/readyz", timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited early:\n{proc.output()}")
        try:
            if httpx.get(url + path, timeout=1).status_code == 200:
                proc.url = url
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{proc.name} not ready after {timeout}s:\n{proc.output()}")


def enrol(api_url: str, admin_token: str, host_id: str, directory: Path) -> tuple[Path, HostCredentials]:
    """Enrol ``host_id`` as an operator does and write its credentials file (mode 0600). Every test
    that starts ``corral agent`` processes starts them with ``--token-file`` on this file."""
    r = httpx.post(
        f"{api_url}/v1/hosts/{host_id}/token", headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    )
    r.raise_for_status()
    path = directory / f"{host_id}.credentials.json"
    write_private(path, r.text)
    return path, HostCredentials.model_validate_json(r.text)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll until ``cond`` holds. The deadline is generous: tests assert that it happens, not how fast."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.1)


def api_args(store: str, port: int, replica_id: str, *extra: str) -> list[str]:
    """``corral api`` arguments for one replica heartbeating-fast on loopback."""
    return [
        "api",
        "--store",
        store,
        "--port",
        str(port),
        "--replica-id",
        replica_id,
        "--heartbeat-interval",
        "0.5",
        *extra,
    ]


@contextlib.contextmanager
def serve_sim(tmp_path: Path, token: str, hosts: int, *extra: str) -> Iterator[Proc]:
    """``corral serve`` on sim hosts heartbeating every 0.5 s, ready, stopped on exit."""
    port = free_port()
    args = ["serve", "--runtime", "sim", "--hosts", str(hosts), "--port", str(port)]
    args += ["--store", f"sqlite:///{tmp_path / 'corral.db'}", "--heartbeat-interval", "0.5", *extra]
    proc = start("serve", args, tmp_path, env={"CORRAL_TOKEN": token})
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        yield proc
    finally:
        proc.stop()


@contextlib.contextmanager
def process_fleet(
    tmp_path: Path, store: str, admin: str, *, replicas: int = 2, api_extra: Sequence[str] = ()
) -> Iterator[tuple[list[Proc], Proc]]:
    """``replicas`` ``corral api`` processes on ``store`` and one enrolled ``corral agent`` running
    real (process) sandboxes, heartbeating every 0.5 s and seen fresh by the last replica; stopped on
    exit."""
    env = {"CORRAL_TOKEN": admin}
    procs: list[Proc] = []
    try:
        started = []
        for i in range(replicas):
            port = free_port()
            started.append(start(f"replica-{i}", api_args(store, port, f"r{i}", *api_extra), tmp_path, env))
            procs.append(started[-1])
            started[-1].url = f"http://127.0.0.1:{port}"
        for r in started:
            wait_ready(r, r.url, timeout=60)
        credentials, _ = enrol(started[0].url, admin, "fleet-host", tmp_path)
        agent_args = ["agent", "--control-plane", started[0].url, "--token-file", str(credentials)]
        agent_args += ["--runtime", "process", "--state-dir", str(tmp_path / "agent-state")]
        agent_args += ["--memory-mb", "4096", "--headroom-mb", "0"]
        agent_args += ["--listen", f"127.0.0.1:{free_port()}", "--heartbeat-interval", "0.5"]
        agent = start("agent", agent_args, tmp_path, env)
        procs.append(agent)
        with httpx.Client(base_url=started[-1].url, headers={"Authorization": f"Bearer {admin}"}) as client:

            def fresh() -> bool:
                hosts = client.get("/v1/hosts").json()["hosts"]
                return any(h["heartbeat_age_s"] is not None and h["heartbeat_age_s"] < 5 for h in hosts)

            wait_for(fresh, 60, "the agent's first heartbeat")
        yield started, agent
    finally:
        for p in procs:
            p.stop()
