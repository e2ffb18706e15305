"""A host names every control-plane replica: when the one it talks to dies, its heartbeats move on."""

from __future__ import annotations

import httpx

from corral.agent.protocol import AgentHeartbeat
from corral.agent.sinks import HeartbeatRejected, HttpHeartbeatSink
from corral.core.types import AdmissionMode

HB = AgentHeartbeat(
    agent_id="h1",
    seq=1,
    address="http://h1",
    sent_at=0.0,
    cpu_total=4,
    cpu_used=0,
    memory_mb_total=8192,
    memory_mb_used=0,
    memory_admission=AdmissionMode.WORKING_SET,
    memory_mb_admittable=6144,
    runtime="sim",
)


async def test_heartbeats_fail_over_to_the_next_replica_and_stay_there() -> None:
    seen: list[str] = []
    dead = {"a"}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        if request.url.host in dead:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(200, json={"accepted": True})

    sink = HttpHeartbeatSink(
        ["http://a", "http://b", "http://c"], "t" * 16, transport=httpx.MockTransport(handler)
    )
    await sink(HB)
    await sink(HB)
    assert seen == ["a", "b", "b"]
    assert sink.url == "http://b/v1/agent/heartbeat"
    dead.update({"b", "c"})
    try:
        await sink(HB)
    except httpx.ConnectError:
        pass
    else:
        raise AssertionError("no replica answered: the sink must say so")
    await sink.aclose()


async def test_a_bad_token_is_not_retried_on_every_replica() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.host)
        return httpx.Response(401, json={"error": {"code": "unauthorized"}})

    sink = HttpHeartbeatSink(["http://a", "http://b"], "t" * 16, transport=httpx.MockTransport(handler))
    try:
        await sink(HB)
    except HeartbeatRejected as e:
        assert e.status == 401
    assert seen == ["a"]
    await sink.aclose()
