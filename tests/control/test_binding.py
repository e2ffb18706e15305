"""How the create flow takes each way an agent can say no."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from corral.agent.client import AgentClient
from corral.agent.errors import AgentInvalid, AgentRefusal, AgentUnauthorized, AgentUnavailable
from corral.agent.protocol import Capacity, ExecRequest, SandboxInfo, SandboxSamples, StartSandbox
from corral.codes import ErrorCode
from corral.control.binding import elsewhere_reason
from corral.exec_result import ExecResult

from .conftest import ADMIN, make_cluster


def test_which_refusals_send_a_create_elsewhere() -> None:
    assert elsewhere_reason(AgentRefusal(ErrorCode.HOST_STARTS_SATURATED)) == ErrorCode.HOST_STARTS_SATURATED
    assert elsewhere_reason(AgentRefusal(ErrorCode.HOST_MEMORY_PRESSURE)) == ErrorCode.HOST_MEMORY_PRESSURE
    assert elsewhere_reason(AgentUnavailable()) == ErrorCode.AGENT_UNAVAILABLE
    assert elsewhere_reason(TimeoutError()) == ErrorCode.AGENT_UNAVAILABLE
    assert elsewhere_reason(AgentInvalid(ErrorCode.TEMPLATE_MISSING)) == ErrorCode.TEMPLATE_MISSING
    assert elsewhere_reason(AgentUnauthorized()) is None
    assert elsewhere_reason(ValueError()) is None


class Refusing(AgentClient):
    """An agent that answers every start with one error."""

    def __init__(self, error: Exception) -> None:
        self.error = error
        self.starts = 0

    async def start(self, req: StartSandbox) -> SandboxInfo:
        self.starts += 1
        raise self.error

    async def stop(self, sandbox_id: str, epoch: int | None = None) -> None:
        return None

    async def exec(self, sandbox_id: str, req: ExecRequest, epoch: int | None = None) -> ExecResult:
        raise self.error

    async def list(self) -> list[SandboxInfo]:
        return []

    async def capacity(self) -> Capacity:
        raise self.error

    async def samples(self, sandbox_id: str, start: float, end: float) -> SandboxSamples:
        raise self.error


async def test_a_host_missing_the_template_sends_the_create_elsewhere(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=2)
    try:
        broken = Refusing(AgentInvalid(ErrorCode.TEMPLATE_MISSING, "no such template here"))
        c.plane.agents.add("host-01", broken)  # type: ignore[attr-defined]
        for _ in range(6):
            r = await c.http.post("/v1/sandboxes", json={}, headers=c.as_(ADMIN))
            assert r.status_code == 201 and r.json()["host_id"] == "host-02"
        assert broken.starts >= 1
        assert await c.plane.store.outstanding() != {}  # only the placed ones' claims remain
        await c.beat()
        assert await c.plane.store.outstanding() == {}
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_an_agent_that_rejects_the_control_plane_is_a_502_not_a_500(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=1)
    try:
        c.plane.agents.add("host-01", Refusing(AgentUnauthorized(message="bad agent token")))  # type: ignore[attr-defined]
        r = await c.http.post("/v1/sandboxes", json={}, headers=c.as_(ADMIN))
        assert r.status_code == 502 and r.json()["error"]["code"] == "unauthorized"
        assert await c.plane.store.outstanding() == {}
        assert (await c.plane.store.list_sandboxes(limit=10)).items == []
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_a_batch_larger_than_the_hosts_starts_limit_lands_whole(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=2)
    try:
        for a in c.fleet.agents:
            a.runtime.start_latency_s = 0.02  # type: ignore[attr-defined]
        r = await c.http.post(
            "/v1/sandboxes/batch", json={"count": 60, "spec": {"memory_mb": 256}}, headers=c.as_(ADMIN)
        )
        assert r.status_code == 201, r.text
        assert len(r.json()["sandboxes"]) == 60
        assert sum(len(a.sandbox_ids()) for a in c.fleet.agents) == 60
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


class Hanging(Refusing):
    """An agent that takes a GET and never answers."""

    def __init__(self) -> None:
        super().__init__(AgentUnavailable())
        self.gets = 0

    async def get(self, sandbox_id: str) -> SandboxInfo:
        self.gets += 1
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_a_host_that_does_not_say_what_a_disk_holds_leaves_the_field_null(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=1)
    try:
        r = await c.http.post("/v1/sandboxes", json={}, headers=c.as_(ADMIN))
        assert r.status_code == 201
        record = await c.plane.store.get_sandbox(r.json()["id"])
        assert record is not None
        hanging = Hanging()
        c.plane.agents.add("host-01", hanging)  # type: ignore[attr-defined]
        # An image sandbox's GET asks its host; a host that never answers costs the GET a bound.
        imaged = dataclasses.replace(record, image="sha256:" + "0" * 64)
        assert await c.plane.sandboxes.disk_used_mb(imaged) is None
        assert hanging.gets == 1
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()
