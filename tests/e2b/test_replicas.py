"""The e2b SDK against two ``corral api`` replicas on PostgreSQL and a ``corral agent`` running real
sandboxes: created through one replica, driven through the other, whose data plane forwards every call
to the sandbox's host."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from e2b import CommandExitException, Sandbox

from corral.runtime.process import unavailable_reason
from tests.e2e.procs import Proc, enrol, free_port, start, wait_ready
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.timeout(180)]

ADMIN = "e2b-replicas-admin-token-01234"


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[list[Proc], str]]:
    assert unavailable_reason() is None
    base = require_pg()
    schema = new_schema_name("corral_e2b")
    store = with_schema(base, schema)
    env = {"CORRAL_TOKEN": ADMIN}
    procs: list[Proc] = []
    try:
        replicas = []
        for i in range(2):
            port = free_port()
            args = ["api", "--store", store, "--port", str(port), "--replica-id", f"e{i}"]
            replicas.append(start(f"e2b-replica-{i}", [*args, "--heartbeat-interval", "0.5"], tmp_path, env))
            procs.append(replicas[-1])
            replicas[-1].url = f"http://127.0.0.1:{port}"
        for r in replicas:
            wait_ready(r, r.url, timeout=60)
        agent_port = free_port()
        credentials, _ = enrol(replicas[0].url, ADMIN, "e2b-host", tmp_path)
        agent = [
            "agent",
            "--control-plane",
            replicas[0].url,
            "--token-file",
            str(credentials),
            "--runtime",
            "process",
            "--memory-mb",
            "4096",
            "--headroom-mb",
            "0",
            "--listen",
            f"127.0.0.1:{agent_port}",
            "--heartbeat-interval",
            "0.5",
        ]
        procs.append(start("e2b-agent", agent, tmp_path, env))
        with httpx.Client(base_url=replicas[1].url, headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
            deadline = time.monotonic() + 60
            while not [h for h in admin.get("/v1/hosts").json()["hosts"] if h["heartbeat_age_s"] < 5]:
                assert time.monotonic() < deadline, "the agent never heartbeated"
                time.sleep(0.2)
            r = admin.post("/v1/tenants", json={"name": "alice"})
            assert r.status_code == 201, r.text
            key = r.json()["token"]
        yield replicas, key
    finally:
        for p in procs:
            p.stop()
        drop_schema(base, schema)


def test_a_sandbox_created_on_one_replica_is_driven_through_the_other(
    fleet: tuple[list[Proc], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (creator, other), key = fleet
    monkeypatch.setenv("E2B_API_KEY", key)
    monkeypatch.setenv("E2B_API_URL", creator.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", other.url)  # every data-plane call goes to the other replica
    sb = Sandbox.create()
    try:
        lines: list[str] = []
        r = sb.commands.run("echo one; echo two", on_stdout=lines.append)
        assert r.stdout == "one\ntwo\n" and "".join(lines) == "one\ntwo\n"
        with pytest.raises(CommandExitException):
            sb.commands.run("exit 7")
        blob = os.urandom(1024 * 1024)
        sb.files.write("/tmp/blob", blob)
        assert sb.files.read("/tmp/blob", format="bytes") == blob
        sb.pause()
        again = Sandbox.connect(sb.sandbox_id, api_url=other.url)
        assert again.commands.run("echo back").stdout == "back\n"
        # A call that already went through a replica is not forwarded a second time.
        hop = httpx.post(
            other.url + "/process.Process/List",
            json={},
            headers={"E2b-Sandbox-Id": sb.sandbox_id, "X-API-KEY": key, "Corral-Forwarded": "1"},
        )
        assert hop.status_code == 421 and hop.json()["error_code"] == "misdirected"
    finally:
        sb.kill()
    assert not sb.is_running()
