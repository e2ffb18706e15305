"""The agent's HTTP API: bearer auth, stable error codes in the error body every corral API answers
with, 404 and 422, and no input that can make it answer 500."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from agent_doubles import POLICY, TOKEN
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.agent import Agent, AgentConfig, PressureSignal
from corral.agent.http import create_app
from corral.core import ManualClock
from corral.core.types import AdmissionMode
from corral.runtime.sim import SimRuntime

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
async def http(make_agent: Callable[..., Agent]) -> AsyncIterator[httpx.AsyncClient]:
    agent = make_agent(admission=AdmissionMode.COMMITTED)
    transport = httpx.ASGITransport(create_app(agent, TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        yield client


def error(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "retry_after_s", "details"}
    err: dict[str, Any] = body["error"]
    return err


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": TOKEN},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {TOKEN}x"},
        {"Authorization": f"Bearer {TOKEN[:-1]}"},
        {"Authorization": f"Bearer {TOKEN[:-1]}X"},  # same length, last byte wrong
    ],
)
async def test_bad_or_missing_token_is_401(http: httpx.AsyncClient, headers: dict[str, str]) -> None:
    for method, path, body in [
        ("GET", "/v1/capacity", None),
        ("GET", "/v1/sandboxes", None),
        ("POST", "/v1/sandboxes", {"id": "a", "memory_mb": 512}),
        ("POST", "/v1/sandboxes", {"id": "a", "memory_mb": "not a number"}),  # 401 before 422
        ("DELETE", "/v1/sandboxes/a", None),
        ("POST", "/v1/sandboxes/a/exec", {"command": ["true"]}),
    ]:
        r = await http.request(method, path, json=body, headers=headers)
        assert r.status_code == 401, (method, path)
        assert error(r)["code"] == "unauthorized"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    # Nothing was started by the unauthenticated attempts.
    assert (await http.get("/v1/sandboxes", headers=AUTH)).json() == []


def test_app_refuses_to_run_without_a_token(make_agent: Callable[..., Agent]) -> None:
    with pytest.raises(ValueError):
        create_app(make_agent(), "")


async def test_lifecycle_over_http(http: httpx.AsyncClient) -> None:
    r = await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 1024, "env": {"X": "1"}}, headers=AUTH)
    assert r.status_code == 201
    assert r.json()["id"] == "a" and r.json()["charged_mb"] == 1024
    r = await http.post("/v1/sandboxes/a/exec", json={"command": ["env"], "env": {"Y": "2"}}, headers=AUTH)
    assert r.status_code == 200 and r.json()["stdout"] == "HOSTNAME=a\nX=1\nY=2\n"
    assert [s["id"] for s in (await http.get("/v1/sandboxes", headers=AUTH)).json()] == ["a"]
    assert (await http.get("/v1/sandboxes/a", headers=AUTH)).json()["memory_mb"] == 1024
    cap = (await http.get("/v1/capacity", headers=AUTH)).json()
    assert cap["memory_mb_admittable"] == 16_384 - 2048 - 1024 and cap["memory_admission"] == "committed"
    assert (await http.delete("/v1/sandboxes/a", headers=AUTH)).status_code == 204
    assert (await http.get("/v1/sandboxes", headers=AUTH)).json() == []
    assert (await http.get("/healthz")).json()["status"] == "ok"


async def test_unknown_sandbox_is_404(http: httpx.AsyncClient) -> None:
    for method, path, body in [
        ("GET", "/v1/sandboxes/nope", None),
        ("DELETE", "/v1/sandboxes/nope", None),
        ("POST", "/v1/sandboxes/nope/exec", {"command": ["true"]}),
        ("DELETE", "/v1/sandboxes/a%2Fb", None),
        ("GET", "/v1/no-such-route", None),
    ]:
        r = await http.request(method, path, json=body, headers=AUTH)
        assert r.status_code == 404, path
        assert error(r)["code"] == "not_found"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"memory_mb": 512}, "id"),
        ({"id": "a"}, "memory_mb"),
        ({"id": "a", "memory_mb": -1}, "memory_mb"),
        ({"id": "a", "memory_mb": 0}, "memory_mb"),
        ({"id": "a", "memory_mb": "lots"}, "memory_mb"),
        ({"id": "a", "memory_mb": True}, "memory_mb"),
        ({"id": "a", "memory_mb": 1.5}, "memory_mb"),
        ({"id": "a", "memory_mb": 10**30}, "memory_mb"),
        ({"id": "a/b", "memory_mb": 512}, "id"),
        ({"id": "", "memory_mb": 512}, "id"),
        ({"id": "a", "memory_mb": 512, "cpus": 0}, "cpus"),
        ({"id": "a", "memory_mb": 512, "stateful": "yes"}, "stateful"),
        ({"id": "a", "memory_mb": 512, "env": {"K": 1}}, "env.K"),
        ({"id": "a", "memory_mb": 512, "hostname": "bad host"}, "hostname"),
        ({"id": "a", "memory_mb": 512, "colour": "red"}, "colour"),
    ],
)
async def test_bad_start_is_422_naming_the_field(
    http: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    r = await http.post("/v1/sandboxes", json=body, headers=AUTH)
    assert r.status_code == 422
    err = error(r)
    assert err["code"] == "invalid_request"
    assert err["details"]["field"] == field
    assert field in err["message"]
    assert (await http.get("/v1/sandboxes", headers=AUTH)).json() == []  # and nothing was started


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "command"),
        ({"command": []}, "command"),
        ({"command": "echo hi"}, "command"),
        ({"command": ["true"], "timeout_s": 0}, "timeout_s"),
        ({"command": ["true"], "timeout_s": 10**9}, "timeout_s"),
        ({"command": ["true"], "cwd": "relative"}, "cwd"),
    ],
)
async def test_bad_exec_is_422_naming_the_field(
    http: httpx.AsyncClient, body: dict[str, Any], field: str
) -> None:
    await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 512}, headers=AUTH)
    r = await http.post("/v1/sandboxes/a/exec", json=body, headers=AUTH)
    assert r.status_code == 422
    assert error(r)["details"]["field"] == field


async def test_body_that_is_not_json_is_422(http: httpx.AsyncClient) -> None:
    for content in [b"{", b"not json", b"[]", b"null", b'"x"']:
        r = await http.post(
            "/v1/sandboxes", content=content, headers={**AUTH, "Content-Type": "application/json"}
        )
        assert r.status_code == 422, content
        assert error(r)["code"] == "invalid_request" and error(r)["details"]["field"] == "body"


async def test_refusals_are_503_with_retry_after_and_a_stable_code(
    make_agent: Callable[..., Agent],
) -> None:
    reading = [0.0]
    agent = make_agent(
        admission=AdmissionMode.COMMITTED,
        pressure=PressureSignal("psi", lambda: reading[0], close_at=10.0, open_at=5.0),
    )
    transport = httpx.ASGITransport(create_app(agent, TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        r = await http.post("/v1/sandboxes", json={"id": "big", "memory_mb": 20_000}, headers=AUTH)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        err = error(r)
        assert err["code"] == "host_does_not_fit" and err["retry_after_s"] > 0
        assert err["details"]["needed_mb"] == 20_000 and err["details"]["admission"] == "committed"

        reading[0] = 50.0
        r = await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 512}, headers=AUTH)
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        assert error(r)["code"] == "host_memory_pressure"


async def test_conflicting_start_is_409_and_a_retried_start_is_idempotent(http: httpx.AsyncClient) -> None:
    first = await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 512}, headers=AUTH)
    again = await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 512}, headers=AUTH)
    assert first.status_code == again.status_code == 201 and first.json() == again.json()
    r = await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 1024}, headers=AUTH)
    assert r.status_code == 409 and error(r)["code"] == "sandbox_exists"
    assert len((await http.get("/v1/sandboxes", headers=AUTH)).json()) == 1


async def test_template_the_host_lacks_is_named(make_agent: Callable[..., Agent]) -> None:
    agent = make_agent(templates=["python"])
    transport = httpx.ASGITransport(create_app(agent, TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        r = await http.post(
            "/v1/sandboxes", json={"id": "a", "memory_mb": 512, "template": "ruby"}, headers=AUTH
        )
        assert r.status_code == 422
        assert error(r)["code"] == "template_missing" and error(r)["details"]["field"] == "template"
        ok = await http.post(
            "/v1/sandboxes", json={"id": "b", "memory_mb": 512, "template": "python"}, headers=AUTH
        )
        assert ok.status_code == 201


_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
_start_like = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.text(max_size=140), _json),
        "memory_mb": st.one_of(st.integers(-(2**70), 2**70), _json),
        "cpus": _json,
        "stateful": _json,
        "template": _json,
        "env": _json,
        "hostname": _json,
    },
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    start=st.one_of(_start_like, _json), exec_body=st.one_of(_json, st.fixed_dictionaries({"command": _json}))
)
def test_no_input_produces_a_500(start: Any, exec_body: Any) -> None:
    async def scenario() -> None:
        clock = ManualClock(0.0)
        agent = Agent(
            AgentConfig("h", 65_536, 8.0, policy=POLICY),
            SimRuntime(clock, random.Random(0)),
            clock=clock,
            pressure=lambda: 0,
        )
        transport = httpx.ASGITransport(create_app(agent, TOKEN), raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
            await http.post("/v1/sandboxes", json={"id": "fixed", "memory_mb": 512}, headers=AUTH)
            r = await http.post("/v1/sandboxes", json=start, headers=AUTH)
            assert r.status_code in {201, 409, 422, 503}, r.text
            if r.status_code != 201:
                error(r)
            r = await http.post("/v1/sandboxes/fixed/exec", json=exec_body, headers=AUTH)
            assert r.status_code in {200, 422}, r.text

    asyncio.run(scenario())


async def test_metrics_are_behind_the_token_and_in_base_units(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    agent = make_agent(admission=AdmissionMode.COMMITTED)
    transport = httpx.ASGITransport(create_app(agent, TOKEN))
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as http:
        await http.post("/v1/sandboxes", json={"id": "a", "memory_mb": 1024}, headers=AUTH)
        await http.post("/v1/sandboxes", json={"id": "big", "memory_mb": 99_999}, headers=AUTH)
        clock.advance(30)
        await agent.measure()
        clock.advance(1)  # a reading replaces the reserve once two agree
        await agent.measure()
        assert (await http.get("/metrics")).status_code == 401
        r = await http.get("/metrics", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    lines = dict(line.rsplit(" ", 1) for line in r.text.splitlines() if line and not line.startswith("#"))
    mib = 1024 * 1024
    assert float(lines['corral_agent_memory_admittable_bytes{agent="host-1"}']) == (14_336 - 1024) * mib
    assert float(lines['corral_agent_sandboxes{agent="host-1"}']) == 1
    assert float(lines['corral_agent_refusals_total{agent="host-1",reason="host_does_not_fit"}']) == 1
    assert float(lines['corral_agent_intake_open{agent="host-1"}']) == 1
    assert 0 < float(lines['corral_agent_resident_to_committed_ratio{agent="host-1"}']) < 1


async def test_a_call_without_the_host_key_is_refused_before_its_body_is_read(
    make_agent: Callable[..., Agent],
) -> None:
    app = create_app(make_agent(), TOKEN)
    reads = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal reads
        reads += 1
        return {"type": "http.request", "body": b"x" * (1024 * 1024), "more_body": True}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    for headers in ([], [(b"authorization", b"Bearer wrong-key")]):
        sent.clear()
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/sandboxes",
            "raw_path": b"/v1/sandboxes",
            "query_string": b"",
            "headers": [(b"content-length", b"10485760"), *headers],
            "http_version": "1.1",
            "scheme": "http",
            "server": ("agent", 80),
            "client": ("x", 1),
            "root_path": "",
        }
        await app(scope, receive, send)
        assert sent[0]["status"] == 401
    assert reads == 0
