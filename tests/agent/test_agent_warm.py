"""The agent's warm book over its wire: targets arrive in the heartbeat's reply, claims go through the
HTTP API and come back as the same errors in-process or remote, and a hostile claim gets a 4xx."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest

from corral.agent.agent import Agent
from corral.agent.client import HttpAgentClient, LocalAgentClient
from corral.agent.errors import AgentWarmEmpty
from corral.agent.http import create_app
from corral.agent.protocol import ROLE_CLAIMED, ROLE_WARM, ClaimWarm, HeartbeatReply, WarmTarget
from corral.agent.sinks import HttpHeartbeatSink

TOKEN = "agent-token-warm"


async def filled(agent: Agent, template: str, n: int) -> None:
    agent.set_warm_targets([WarmTarget(template=template, target=n, memory_mb=256)])
    for _ in range(100):
        agent.replenish()
        await asyncio.sleep(0)
        if agent.warm.ready_count(template) == n:
            return
    raise AssertionError("the pool did not fill")


async def test_targets_arrive_in_the_heartbeat_reply(make_agent: Callable[..., Agent]) -> None:
    reply = HeartbeatReply(warm_targets=[WarmTarget(template="py", target=2, memory_mb=256)])

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=reply.model_dump_json())

    sink = HttpHeartbeatSink("http://cp", "tok", transport=httpx.MockTransport(answer))
    agent = make_agent(sink=sink)
    await agent.beat()
    assert agent.warm.target("py") == 2
    agent.replenish()
    await asyncio.sleep(0)
    hb = await agent.beat()
    assert hb.warm["py"].ready == 2 and set(hb.roles.values()) == {ROLE_WARM} and not hb.owned_ids()
    await sink.aclose()


@pytest.mark.parametrize("remote", [False, True])
async def test_claims_through_either_client(make_agent: Callable[..., Agent], remote: bool) -> None:
    agent = make_agent()
    await filled(agent, "py", 2)
    client = (
        HttpAgentClient("http://agent", TOKEN, transport=httpx.ASGITransport(app=create_app(agent, TOKEN)))
        if remote
        else LocalAgentClient(agent)
    )
    got = {(await client.claim("py", ClaimWarm(env={"K": "v"}))).id for _ in range(2)}
    assert len(got) == 2 and all(agent.warm.role(i) == ROLE_CLAIMED for i in got)
    with pytest.raises(AgentWarmEmpty):
        await client.claim("py", ClaimWarm())
    with pytest.raises(AgentWarmEmpty):
        await client.claim("other", ClaimWarm())
    await client.aclose()


async def test_hostile_claim_bodies_are_4xx(make_agent: Callable[..., Agent]) -> None:
    agent = make_agent()
    await filled(agent, "py", 1)
    app = create_app(agent, TOKEN)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as http:
        r = await http.post("/v1/warm/py/claim", json={})
        assert r.status_code == 401  # no token, no claim
        auth = {"Authorization": f"Bearer {TOKEN}"}
        for body in (
            {"env": "x"},
            {"env": {"A": 1}},
            {"tenant": "x"},
            {"env": {f"K{i}": "v" for i in range(300)}},
        ):
            r = await http.post("/v1/warm/py/claim", json=body, headers=auth)
            assert r.status_code == 422, body
        assert agent.warm.ready_count("py") == 1  # nothing was taken by a refused claim


async def test_warm_room_is_admittable_and_a_create_evicts(make_agent: Callable[..., Agent]) -> None:
    agent = make_agent()
    before = agent.capacity().memory_mb_admittable
    await filled(agent, "py", 3)
    assert agent.capacity().memory_mb_admittable == before  # a pool never shrinks what creates may take
    assert agent.admittable_mb() < before  # but the gate charges the warm sandboxes
