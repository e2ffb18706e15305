"""``LocalAgentClient`` and ``HttpAgentClient`` behave the same against the same agent."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from agent_doubles import TOKEN

from corral.agent import (
    Agent,
    AgentClient,
    AgentConfig,
    AgentConflict,
    AgentError,
    AgentInvalid,
    AgentRefusal,
    AgentSandboxNotFound,
    AgentUnauthorized,
    AgentUnavailable,
    ExecRequest,
    HttpAgentClient,
    LocalAgentClient,
    StartSandbox,
)
from corral.agent.errors import error_from_response
from corral.agent.http import create_app
from corral.codes import ErrorCode
from corral.control.agents import HttpAgents
from corral.core import ManualClock
from corral.core.types import AdmissionMode
from corral.runtime.sim import SimRuntime


@pytest.fixture(params=["local", "http"])
async def client(
    request: pytest.FixtureRequest, make_agent: Callable[..., Agent]
) -> AsyncIterator[AgentClient]:
    agent = make_agent(admission=AdmissionMode.COMMITTED, templates=["python"])
    c: AgentClient
    if request.param == "local":
        c = LocalAgentClient(agent)
    else:
        c = HttpAgentClient("http://agent", TOKEN, transport=httpx.ASGITransport(create_app(agent, TOKEN)))
    yield c
    await c.aclose()


async def test_round_trip(client: AgentClient, clock: ManualClock) -> None:
    info = await client.start(StartSandbox(id="a", memory_mb=2048, cpus=2.0, hostname="box"))
    assert (info.id, info.memory_mb, info.cpus, info.hostname, info.charged_mb) == (
        "a",
        2048,
        2.0,
        "box",
        2048,
    )
    assert info.started_at == clock.now() and info.resident_mb is None

    out = await client.exec("a", ExecRequest(command=["cat", "/etc/hostname"]))
    assert (out.exit_code, out.stdout, out.stderr) == (0, "box\n", "")
    out = await client.exec("a", ExecRequest(command=["ls", "/"]))
    assert out.exit_code != 0 and "simulation" in out.stderr

    assert [i.id for i in await client.list()] == ["a"]
    one = await client.get("a")
    assert (one.id, one.memory_mb, one.disk_used_mb) == ("a", 2048, None)  # no disk of its own
    cap = await client.capacity()
    assert cap.memory_mb_admittable == 16_384 - 2048 - 2048 and cap.cpu_used == 2.0
    assert cap.templates == ["python"] and cap.max_concurrent_starts == 8

    await client.stop("a")
    assert await client.list() == []


async def test_same_errors(client: AgentClient) -> None:
    await client.start(StartSandbox(id="a", memory_mb=512))
    with pytest.raises(AgentRefusal) as refused:
        await client.start(StartSandbox(id="huge", memory_mb=100_000))
    assert refused.value.code == ErrorCode.HOST_DOES_NOT_FIT and refused.value.retry_after_s
    assert refused.value.details["needed_mb"] == 100_000
    with pytest.raises(AgentSandboxNotFound):
        await client.stop("nope")
    with pytest.raises(AgentSandboxNotFound):
        await client.exec("nope", ExecRequest(command=["true"]))
    with pytest.raises(AgentSandboxNotFound):
        await client.get("nope")
    with pytest.raises(AgentConflict) as conflict:
        await client.start(StartSandbox(id="a", memory_mb=1024))
    assert conflict.value.code == ErrorCode.SANDBOX_EXISTS
    with pytest.raises(AgentInvalid) as invalid:
        await client.start(StartSandbox(id="b", memory_mb=512, template="ruby"))
    assert invalid.value.code == ErrorCode.TEMPLATE_MISSING


async def test_unreachable_agent_is_unavailable() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    client = HttpAgentClient("http://agent", TOKEN, transport=httpx.MockTransport(down))
    with pytest.raises(AgentUnavailable) as unavailable:
        await client.capacity()
    assert unavailable.value.retryable
    await client.aclose()


async def test_answers_that_are_not_an_agents_are_unavailable() -> None:
    def proxy(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/capacity":
            return httpx.Response(502, text="<html>Bad Gateway</html>")
        return httpx.Response(200, json={"surprise": True})

    client = HttpAgentClient("http://agent", TOKEN, transport=httpx.MockTransport(proxy))
    with pytest.raises(AgentUnavailable):
        await client.capacity()
    with pytest.raises(AgentUnavailable):
        await client.list()
    await client.aclose()


async def test_wrong_token_is_unauthorized_not_unavailable(make_agent: Callable[..., Agent]) -> None:
    app = create_app(make_agent(), TOKEN)
    client = HttpAgentClient("http://agent", "wrong", transport=httpx.ASGITransport(app))
    with pytest.raises(AgentUnauthorized):
        await client.list()
    await client.aclose()


def test_error_bodies_round_trip() -> None:
    for err in [
        AgentRefusal(ErrorCode.HOST_STARTS_SATURATED, "busy", 1.0, {"limit": 8}),
        AgentSandboxNotFound(message="no"),
        AgentConflict(message="dup"),
        AgentInvalid(details={"field": "memory_mb"}),
        AgentUnavailable(message="down", retry_after_s=2.0),
    ]:
        back = error_from_response(err.status, err.body())
        assert type(back) is type(err)
        assert (back.code, back.message, back.retry_after_s, back.details) == (
            err.code,
            err.message,
            err.retry_after_s,
            err.details,
        )
    assert isinstance(error_from_response(418, {"error": {"code": "teapot"}}), AgentError)
    assert isinstance(error_from_response(500, "oops"), AgentUnavailable)


async def test_a_twelve_host_sim_fleet_with_thousands_of_sandboxes() -> None:
    """12 sim hosts, 3,000 sandboxes: every start admitted by the gate, every heartbeat accounts for them."""
    clock = ManualClock(0.0)
    agents = [
        Agent(
            AgentConfig(f"h{n}", 256 * 1024, 64.0),
            SimRuntime(clock, random.Random(n)),
            clock=clock,
            pressure=lambda: 0.0,
        )
        for n in range(12)
    ]
    clients = [LocalAgentClient(a) for a in agents]
    for i in range(3000):
        await clients[i % 12].start(StartSandbox(id=f"sb-{i}", memory_mb=2048))
    clock.advance(30)
    beats = [await a.beat() for a in agents]
    assert sum(len(hb.sandbox_ids) for hb in beats) == 3000
    assert all(hb.memory_mb_admittable == a.admittable_mb() for hb, a in zip(beats, agents, strict=True))
    # Measured at ~300 MiB each, a 2 GiB sandbox costs far less than its promise.
    assert all(0 < hb.memory_mb_used < 250 * 2048 for hb in beats)


async def test_http_agents_present_each_hosts_key_and_follow_a_rotation(
    make_agent: Callable[..., Agent],
) -> None:
    keys = {"h1": "first-key-of-host-h1", "h2": "the-key-of-host-h2"}
    lookups: list[str] = []

    async def lookup(host_id: str) -> str | None:
        lookups.append(host_id)
        return keys.get(host_id)

    apps = {h: create_app(make_agent(), keys[h]) for h in keys}

    async def route(request: httpx.Request) -> httpx.Response:
        transport = httpx.ASGITransport(app=apps[request.url.host])
        return await transport.handle_async_request(request)

    directory = HttpAgents(lookup, transport=httpx.MockTransport(route))
    try:
        assert await directory.client("h1", "http://h1").list() == []
        assert await directory.client("h2", "http://h2").list() == []
        # h1 is re-enrolled behind this replica's back: the agent refuses the cached key once, and
        # the call goes through with the new one.
        keys["h1"] = "second-key-of-host-h1"
        apps["h1"] = create_app(make_agent(), keys["h1"])
        assert await directory.client("h1", "http://h1").list() == []
        assert lookups == ["h1", "h2", "h1"]
        with pytest.raises(AgentUnavailable):
            await directory.client("h3", "http://h3").list()  # never enrolled: no key to present
    finally:
        await directory.aclose()


async def test_pause_and_resume(client: AgentClient) -> None:
    await client.start(StartSandbox(id="a", memory_mb=512))
    charged = (await client.capacity()).memory_mb_admittable
    assert (await client.pause("a")).paused
    assert [i.paused for i in await client.list()] == [True]
    with pytest.raises(AgentConflict) as again:
        await client.pause("a")
    assert again.value.code == ErrorCode.SANDBOX_PAUSED
    with pytest.raises(AgentConflict) as frozen:
        await client.exec("a", ExecRequest(command=["true"]))
    assert frozen.value.code == ErrorCode.SANDBOX_PAUSED
    assert (await client.capacity()).memory_mb_admittable == charged  # kept, not charged again
    assert not (await client.resume("a")).paused
    with pytest.raises(AgentConflict) as running:
        await client.resume("a")
    assert running.value.code == ErrorCode.SANDBOX_NOT_PAUSED
    assert (await client.exec("a", ExecRequest(command=["true"]))).exit_code == 0
    with pytest.raises(AgentSandboxNotFound):
        await client.pause("nope")


async def test_memory_samples_over_a_range(client: AgentClient, clock: ManualClock) -> None:
    await client.start(StartSandbox(id="m", memory_mb=512, cpus=1.0))
    first = clock.now()
    # Asked with none taken yet: read now. Within the interval: nothing new. Past it: read again.
    assert [s.at for s in (await client.samples("m", 0, 1e12)).samples] == [first]
    clock.advance(2)
    assert [s.at for s in (await client.samples("m", 0, 1e12)).samples] == [first]
    clock.advance(3)
    both = (await client.samples("m", 0, 1e12)).samples
    assert [s.at for s in both] == [first, first + 5] and all(s.memory_mb >= 0 for s in both)
    assert [s.at for s in (await client.samples("m", first + 1, first + 5)).samples] == [first + 5]
    assert (await client.samples("m", first + 6, first + 60)).samples == []
    with pytest.raises(AgentSandboxNotFound):
        await client.samples("nope", 0, 1)
