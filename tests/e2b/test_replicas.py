"""The e2b SDK against two ``corral api`` replicas on PostgreSQL and a ``corral agent`` running real
sandboxes: created through one replica, driven through the other, whose data plane forwards every call
to the sandbox's host."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import httpx
import pytest
from e2b import CommandExitException, Sandbox, SandboxState

from corral.runtime.process import unavailable_reason
from tests.e2e.procs import Proc, process_fleet
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

pytestmark = [pytest.mark.postgres, pytest.mark.process, pytest.mark.timeout(180)]

ADMIN = "e2b-replicas-admin-token-01234"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[Proc], str]]:
    tmp_path = tmp_path_factory.mktemp("e2b-replicas")
    assert unavailable_reason() is None
    base = require_pg()
    schema = new_schema_name("corral_e2b")
    try:
        with process_fleet(tmp_path, with_schema(base, schema), ADMIN) as (replicas, _agent):
            with httpx.Client(
                base_url=replicas[1].url, headers={"Authorization": f"Bearer {ADMIN}"}
            ) as admin:
                r = admin.post("/v1/tenants", json={"name": "alice"})
                assert r.status_code == 201, r.text
                key = r.json()["token"]
            yield replicas, key
    finally:
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
        # Its host's samples, asked of the other replica (which reaches the agent over HTTP).
        samples = Sandbox.get_metrics(sb.sandbox_id, api_url=other.url)
        assert samples and samples[-1].mem_used > 0
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


def test_a_paused_sandbox_auto_resumes_through_the_replica_that_does_not_own_it(
    fleet: tuple[list[Proc], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (creator, other), key = fleet
    monkeypatch.setenv("E2B_API_KEY", key)
    monkeypatch.setenv("E2B_API_URL", creator.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", other.url)
    sb = Sandbox.create(timeout=3, lifecycle={"on_timeout": "pause", "auto_resume": True})
    try:
        sb.files.write("/tmp/note", "across")
        deadline = time.monotonic() + 30
        while Sandbox.get_info(sb.sandbox_id, api_url=other.url).state is not SandboxState.PAUSED:
            assert time.monotonic() < deadline, "the timeout never paused it"
            time.sleep(0.2)
        # The other replica's data plane wakes it on its host, then serves the call.
        assert sb.files.read("/tmp/note") == "across"
        assert Sandbox.get_info(sb.sandbox_id).state is SandboxState.RUNNING
    finally:
        sb.kill()
