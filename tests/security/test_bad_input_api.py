"""Each bad input gets a 4xx with a stable code and the field named, never a 5xx, never silently
changed: environment names and values, NUL bytes, argv and env sizes, working directories, memory
below what a runtime can run, metadata, and heartbeats a host could use to poison its record."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from corral.agent.inputs import MAX_ARGV_BYTES, MAX_ENV_VALUE_BYTES, MAX_SANDBOXES_PER_HOST
from corral.api.limits import DEFAULT_BODY_BYTES
from corral.runtime.process import MIN_MEMORY_MB

from .conftest import ADMIN, Cluster


def refused(r: httpx.Response, status: int, code: str, field: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, (r.status_code, r.text[:500])
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == code, err
    if field is not None:
        assert err["details"]["field"].split(".")[0] == field, err
    return err


async def _sandbox(c: Cluster) -> str:
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def _exec(c: Cluster, sid: str, **body: Any) -> httpx.Response:
    return await c.http.post(
        f"/v1/sandboxes/{sid}/exec", json={"command": ["true"], **body}, headers=c.as_(ADMIN)
    )


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"A=B": "x"}, "not a variable name"),
        ({"1X": "x"}, "not a variable name"),
        ({"": "x"}, "not a variable name"),
        ({"A\x00B": "x"}, "not a variable name"),
        ({"GOOD": "a\x00b"}, "NUL"),
        ({"BIG": "x" * 200_000}, "bytes"),
        ({f"V{i}": "x" * 100_000 for i in range(3)}, "environment takes"),
    ],
)
async def test_bad_environments_are_refused_for_create_and_exec(
    cluster: Cluster, env: dict[str, str], why: str
) -> None:
    r = await cluster.http.post("/v1/sandboxes", json={"env": env}, headers=cluster.as_(ADMIN))
    assert why in refused(r, 422, "invalid_request", "env")["message"]
    sid = await _sandbox(cluster)
    err = refused(await _exec(cluster, sid, env=env), 422, "invalid_request", "env")
    assert why in err["message"]


async def test_a_value_at_the_limit_is_accepted(cluster: Cluster) -> None:
    sid = await _sandbox(cluster)
    r = await _exec(cluster, sid, env={"OK": "x" * MAX_ENV_VALUE_BYTES})
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("cwd", ["relative/dir", "/tmp/a\x00b", "", "/" + "a" * 5000])
async def test_a_bad_cwd_is_refused(cluster: Cluster, cwd: str) -> None:
    sid = await _sandbox(cluster)
    refused(await _exec(cluster, sid, cwd=cwd), 422, "invalid_request", "cwd")


async def test_argv_over_its_bound_is_a_422_naming_the_command(cluster: Cluster) -> None:
    sid = await _sandbox(cluster)
    big = ["echo", *(["x" * 1000] * (MAX_ARGV_BYTES // 1000 + 1))]  # within the body cap, over argv's
    err = refused(await _exec(cluster, sid, command=big), 422, "invalid_request", "command")
    assert "bytes" in err["message"]
    refused(await _exec(cluster, sid, command=["echo", "a\x00b"]), 422, "invalid_request", "command")
    refused(await _exec(cluster, sid, command="echo \x00"), 422, "invalid_request", "command")
    refused(await _exec(cluster, sid, command=["x"] * 5000), 422, "invalid_request", "command")


async def test_a_10_mb_argv_is_over_the_body_cap(cluster: Cluster) -> None:
    sid = await _sandbox(cluster)
    r = await _exec(cluster, sid, command=["echo", "x" * (10 * 1024 * 1024)])
    err = refused(r, 413, "payload_too_large")
    assert err["details"]["max_bytes"] == DEFAULT_BODY_BYTES


@pytest.mark.parametrize("memory_mb", [1, 8, MIN_MEMORY_MB - 1])
async def test_memory_below_what_a_runtime_can_run_is_a_422_not_a_503(
    cluster: Cluster, memory_mb: int
) -> None:
    r = await cluster.http.post("/v1/sandboxes", json={"memory_mb": memory_mb}, headers=cluster.as_(ADMIN))
    err = refused(r, 422, "invalid_request", "memory_mb")
    assert "Retry-After" not in r.headers and str(MIN_MEMORY_MB) in err["message"]
    r = await cluster.http.post(
        "/v1/sandboxes/batch", json={"count": 2, "spec": {"memory_mb": memory_mb}}, headers=cluster.as_(ADMIN)
    )
    refused(r, 422, "invalid_request", "memory_mb")
    r = await cluster.http.post(
        "/v1/templates", json={"name": "tiny", "memory_mb": memory_mb}, headers=cluster.as_(ADMIN)
    )
    refused(r, 422, "invalid_request", "memory_mb")


async def test_the_minimum_itself_is_placed(cluster: Cluster) -> None:
    r = await cluster.http.post(
        "/v1/sandboxes", json={"memory_mb": MIN_MEMORY_MB}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("metadata", [{"k": "a\x00b"}, {"a\x00": "v"}, {"k": "v" * 2000}, {"": "v"}])
async def test_bad_metadata_is_refused(cluster: Cluster, metadata: dict[str, str]) -> None:
    r = await cluster.http.post("/v1/sandboxes", json={"metadata": metadata}, headers=cluster.as_(ADMIN))
    refused(r, 422, "invalid_request", "metadata")


async def test_a_body_over_the_cap_is_a_413(cluster: Cluster) -> None:
    r = await cluster.http.post(
        "/v1/sandboxes",
        content=b'{"metadata": {"k": "' + b"x" * (10 * 1024 * 1024) + b'"}}',
        headers={**cluster.as_(ADMIN), "Content-Type": "application/json"},
    )
    refused(r, 413, "payload_too_large")

    async def chunks() -> Any:  # no Content-Length: the cap is enforced while reading
        for _ in range(10):
            yield b"x" * (1024 * 1024)

    r = await cluster.http.post("/v1/sandboxes", content=chunks(), headers=cluster.as_(ADMIN))
    refused(r, 413, "payload_too_large")


# -- heartbeats -----------------------------------------------------------------------------------


async def _beat(c: Cluster, token: str, **changes: Any) -> httpx.Response:
    agent = c.fleet.agents[0]
    agent.acknowledge(agent.heartbeat(), None)  # unacknowledged: the next heartbeat is the whole set
    body = agent.heartbeat().model_dump(mode="json")
    body.update(changes)
    return await c.http.post("/v1/agent/heartbeat", json=body, headers=c.as_(token))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seq", 2**63),
        ("seq", 2**80),
        ("seq", 0),
        ("cpu_total", -1),
        ("memory_mb_total", -5),
        ("memory_mb_used", 2**70),
        ("memory_mb_admittable", 2**70),
        ("cpu_used", "nan"),
        ("address", "file:///etc/passwd"),
        ("address", "http://user:pass@evil.example"),
        ("address", "gopher://x"),
        ("sandbox_ids", ["../../etc"]),
        ("sandbox_ids", [""]),
        ("sandbox_ids", [f"sb-{i}" for i in range(MAX_SANDBOXES_PER_HOST + 1)]),
        ("sent_at", 1e300),
        ("templates", ["x" * 500]),
        ("base", -1),
        ("digest", -1),
        ("digest", 2**63),
        ("removed", ["../x"]),
        ("agent_id", "../x"),
    ],
)
async def test_a_heartbeat_out_of_bounds_is_a_422(cluster: Cluster, field: str, value: Any) -> None:
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    before = await cluster.plane.store.get_host(cluster.fleet.agents[0].id)
    r = await _beat(cluster, creds.agent_token, **{field: value})
    refused(r, 422, "invalid_request", field)
    # and the host's record is untouched: not locked out, not moved
    assert await cluster.plane.store.get_host(cluster.fleet.agents[0].id) == before
    assert (await _beat(cluster, creds.agent_token)).status_code == 200


async def test_a_heartbeat_with_10000_sandboxes_is_accepted(cluster: Cluster) -> None:
    host = cluster.fleet.agents[0].id
    creds = await cluster.plane.enrol_host(host)
    ids = [f"sb-{i:05d}-{'x' * 100}" for i in range(10_000)]  # long ids: a body well over 1 MiB
    r = await _beat(cluster, creds.agent_token, sandbox_ids=ids, seq=2**63 - 1)
    assert r.status_code == 200, r.text[:300]
    rec = await cluster.plane.store.get_host(host)
    assert rec is not None and rec.sandbox_count == 10_000 and rec.seq == 2**63 - 1


@pytest.mark.parametrize(
    "mixed",
    [{"added": ["sb-a"]}, {"removed": ["sb-a"]}, {"base": 7, "sandbox_ids": ["sb-a"]}],
    ids=["added-without-base", "removed-without-base", "whole-set-with-base"],
)
async def test_a_heartbeat_mixing_whole_set_and_changes_is_a_422(
    cluster: Cluster, mixed: dict[str, Any]
) -> None:
    creds = await cluster.plane.enrol_host(cluster.fleet.agents[0].id)
    before = await cluster.plane.store.get_host(cluster.fleet.agents[0].id)
    refused(await _beat(cluster, creds.agent_token, **mixed), 422, "invalid_request")
    assert await cluster.plane.store.get_host(cluster.fleet.agents[0].id) == before


async def test_a_background_commands_bad_input_is_a_422_naming_what_and_starts_nothing(
    cluster: Cluster,
) -> None:
    sid = await _sandbox(cluster)
    admin = cluster.as_(ADMIN)
    path = f"/v1/sandboxes/{sid}/commands"
    for body, field in (
        ({"command": ["echo", "a\x00b"]}, "command"),
        ({"command": ["x"] * 5000}, "command"),
        ({"command": ["true"], "env": {"A=B": "x"}}, "env"),
        ({"command": ["true"], "cwd": "relative"}, "cwd"),
        ({"command": ["true"], "timeout_s": 10**9}, "timeout_s"),
        ({"command": ["true"], "timeout_s": float("nan")}, None),
    ):
        r = await cluster.http.post(
            path, content=_json(body), headers={**admin, "Content-Type": "application/json"}
        )
        refused(r, 422, "invalid_request", field)
    for bad in ("0", "-1", "abc", str(2**63), "1.5"):
        refused(await cluster.http.get(f"{path}/{bad}", headers=admin), 422, "invalid_request")
    for wait in ("-1", "1e9", "nan"):
        refused(await cluster.http.get(f"{path}/1?wait_s={wait}", headers=admin), 422, "invalid_request")
    listed = await cluster.http.get(path, headers=admin)
    assert listed.status_code == 200 and listed.json()["commands"] == [], listed.text


def _json(body: dict[str, Any]) -> bytes:
    return json.dumps(body, allow_nan=True).encode()  # NaN too: what a hostile client can send
