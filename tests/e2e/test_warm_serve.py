"""Warm pools as a user meets them: ``corral serve`` in a real process, the SDK's ``client.pools`` and
the ``corral pools`` commands."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.client import Corral, NotFound

from .procs import CORRAL, Proc, free_port, start, wait_ready

TOKEN = "e2e-warm-admin-token-0123456789"


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Proc]:
    port = free_port()
    proc = start(
        "serve-warm",
        [
            "serve",
            "--runtime",
            "sim",
            "--hosts",
            "4",
            "--port",
            str(port),
            "--store",
            f"sqlite:///{tmp_path / 'corral.db'}",
            "--heartbeat-interval",
            "0.5",
        ],
        tmp_path,
        env={"CORRAL_TOKEN": TOKEN},
    )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        yield proc
    finally:
        proc.stop()


def cli(proc: Proc, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CORRAL, *args, "--url", proc.url, "--token", TOKEN], capture_output=True, text=True, timeout=60
    )


def until(check: object, timeout: float = 30.0) -> float:
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():  # type: ignore[operator]
            return time.monotonic() - began
        time.sleep(0.2)
    raise AssertionError("timed out")


def test_pool_through_the_sdk_and_the_cli(serve: Proc) -> None:
    with httpx.Client(base_url=serve.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        assert http.post("/v1/templates", json={"name": "py", "memory_mb": 256}).status_code == 201
    out = cli(serve, "pools", "create", "py", "--size", "8", "--max-per-host", "3")
    assert out.returncode == 0, out.stderr
    with Corral(serve.url, TOKEN) as client:
        until(lambda: client.pools.get("py").ready == 8)
        pool = client.pools.get("py")
        assert sum(h.target for h in pool.per_host.values()) == 8
        assert max(h.target for h in pool.per_host.values()) <= 3
        sb = client.sandboxes.create("py", env={"WHO": "warm"})
        assert sb.warm and sb.state == "running"
        result = client.sandboxes.exec(sb.id, ["env"])  # at once: the record was durable before the answer
        assert result.exit_code == 0 and "WHO=warm" in result.stdout
        assert client.sandboxes.get(sb.id).warm
        cold = client.sandboxes.create("py", memory_mb=512)
        assert not cold.warm
        until(lambda: client.pools.get("py").ready == 8)  # refilled
        # The hosts' own heartbeats say so too (each host beats at its own phase: read until they agree).
        until(lambda: sum(h.warm.get("py", {}).get("ready", 0) for h in client.hosts.list()) == 8)
        listed = json.loads(cli(serve, "pools", "ls", "--json").stdout)["pools"]
        assert [(p["template"], p["size"], p["hits"], p["misses"]) for p in listed] == [("py", 8, 1, 1)]
        out = cli(serve, "pools", "rm", "py")
        assert out.returncode == 0, out.stderr
        until(lambda: sum(h.warm.get("py", {}).get("ready", 0) for h in client.hosts.list()) == 0)
        assert client.sandboxes.get(sb.id).state == "running"  # claimed ones stay
        with pytest.raises(NotFound):
            client.pools.get("py")
