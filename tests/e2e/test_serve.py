"""``corral serve`` as a user runs it: a real process, real HTTP, the SDK and the CLI."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .procs import CORRAL, Proc
from .procs import serve_sim as serve_sim_proc

TOKEN = "e2e-admin-token-0123456789"


@pytest.fixture
def serve_sim(tmp_path: Path) -> Iterator[Proc]:
    with serve_sim_proc(tmp_path, TOKEN, 12) as proc:
        yield proc


def admin(url: str) -> httpx.Client:
    return httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)


def test_burst_through_the_cli_spreads_and_cleans_up(serve_sim: Proc) -> None:
    out = subprocess.run(
        [*CORRAL, "burst", "-n", "50", "--json", "--url", serve_sim.url, "--token", TOKEN],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr + out.stdout
    report = json.loads(out.stdout)
    assert len(report["per_host"]) == 12 and sum(report["per_host"].values()) == 50
    assert report["max"] <= 5, report["per_host"]
    assert report["max_to_median"] <= 1.25
    assert report["p50_ms"] > 0 and report["p99_ms"] >= report["p50_ms"]
    with admin(serve_sim.url) as c:
        assert c.get("/v1/sandboxes").json()["sandboxes"] == []  # burst deleted what it made


def test_fill_until_refusal_then_errors_a_client_can_act_on(serve_sim: Proc) -> None:
    with admin(serve_sim.url) as c:
        placed = []
        while True:
            r = c.post("/v1/sandboxes", json={"memory_mb": 16384, "stateful": True})
            if r.status_code != 201:
                break
            placed.append(r.json()["id"])
            assert len(placed) <= 24
        # 12 hosts x (32768 - 2048) admittable / 16384 charged in full = 1 each
        assert len(placed) == 12
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_capacity"
        assert int(r.headers["Retry-After"]) >= 1
        bad = c.post("/v1/sandboxes", json={"memory_mb": "x"})
        assert bad.status_code == 422 and bad.json()["error"]["details"]["field"] == "memory_mb"
        assert (
            httpx.get(serve_sim.url + "/v1/sandboxes", headers={"Authorization": "Bearer no"}).status_code
            == 401
        )
        for sid in placed:
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
        # the room is back as soon as the hosts' next heartbeats say so (a client retries until then)
        deadline = time.monotonic() + 20
        while (r := c.post("/v1/sandboxes", json={"memory_mb": 16384, "stateful": True})).status_code == 503:
            assert time.monotonic() < deadline, r.text
            time.sleep(float(r.headers["Retry-After"]) / 4)
        assert r.status_code == 201


def test_the_readme_sdk_example(serve_sim: Proc) -> None:
    from corral.client import Corral

    with Corral(serve_sim.url, TOKEN) as client:
        with client.sandboxes.create(template="default", memory_mb=1024) as sb:
            assert sb.host_id is not None and sb.host_id.startswith("host-")
            assert sb.exec(["echo", "hi"]).stdout == "hi\n"
            sid = sb.id
        with admin(serve_sim.url) as c:
            assert c.get(f"/v1/sandboxes/{sid}").status_code == 404  # killed on exit
