"""Secrets stay secret: no token or environment value reaches a log line, even at DEBUG, and the
credentials file enrolment writes is its owner's alone."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import app

from .conftest import ADMIN, Cluster

ENV_CANARY = "canary-env-value-7f3a9c"
TOKEN_CANARY = "canary-token-value-1b8e2d44"


async def test_no_token_or_env_value_is_logged_at_debug(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    http = cluster.http
    tenant = (await http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))).json()
    token = tenant["token"]
    env = {"SECRET": ENV_CANARY}
    r = await http.post("/v1/sandboxes", json={"env": env, "memory_mb": 256}, headers=cluster.as_(token))
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    ex = await http.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["true"], "env": env}, headers=cluster.as_(token)
    )
    assert ex.status_code == 200, ex.text
    # refusals too: an unknown token, a bad env key next to a canary value, a heartbeat from a host
    assert (await http.get("/v1/sandboxes", headers=cluster.as_(TOKEN_CANARY))).status_code == 401
    bad = await http.post("/v1/sandboxes", json={"env": {"A=B": ENV_CANARY}}, headers=cluster.as_(token))
    assert bad.status_code == 422 and ENV_CANARY not in bad.text
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    hb = cluster.fleet.agents[0].heartbeat().model_dump(mode="json")
    assert (
        await http.post("/v1/agent/heartbeat", json=hb, headers=cluster.as_(creds.agent_token))
    ).status_code == 200
    await cluster.beat()
    assert caplog.records, "the capture saw nothing: the test would prove nothing"
    for secret in (ENV_CANARY, TOKEN_CANARY, token, ADMIN, creds.agent_token, creds.host_key):
        assert secret not in caplog.text


def test_hosts_token_writes_an_owner_only_credentials_file(tmp_path: Path) -> None:
    # The CLI against a stub that answers as the enrolment route does.
    body = {"host_id": "h1", "agent_token": "a" * 24, "host_key": "k" * 24}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/hosts/h1/token" and request.method == "POST"
        return httpx.Response(201, json=body)

    from corral.client.cli import ClientFactory

    out = tmp_path / "h1.json"
    out.write_text("stale")
    out.chmod(0o644)
    result = CliRunner().invoke(
        app,
        ["hosts", "token", "h1", "--out", str(out), "--url", "http://cp.test", "--token", "t" * 20],
        obj=ClientFactory(transport=httpx.MockTransport(handler)),
    )
    assert result.exit_code == 0, result.output
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert json.loads(out.read_text()) == body
    assert "a" * 24 not in result.output and "k" * 24 not in result.output
