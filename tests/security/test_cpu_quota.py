"""CPU as a tenant takes it. CPU is overcommitted on every host (``cpu_overcommit``, 4x by default),
so a tenant's ``max_cpus`` is what bounds its share of the fleet: racing creates, parked ones included,
never take more than it. A create asking for more CPUs (or memory) than the largest host has is the
caller's mistake, 422 naming the field, and leaves nothing: no record, no quota taken, nothing parked.
Every surface that creates refuses it alike: a single create, a waiting one, a batch, E2B's create."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.store import SandboxState, Usage
from tests.control.conftest import make_cluster

from .conftest import ADMIN, Cluster

HOST_CPUS = 8.0
HOST_MB = 16384
H = {"Authorization": f"Bearer {ADMIN}"}


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Cluster]:
    c = await make_cluster(tmp_path, hosts=3, memory_mb=HOST_MB, cpus=HOST_CPUS)
    c.plane.waiting.poll_s = 0.005
    try:
        yield c
    finally:
        await c.close()


async def tenant(c: Cluster, name: str, **quota: Any) -> tuple[str, dict[str, str]]:
    r = await c.http.post("/v1/tenants", json={"name": name, **quota}, headers=H)
    assert r.status_code == 201, r.text
    return r.json()["id"], c.as_(r.json()["token"])


async def live(c: Cluster, tenant_id: str) -> list[str]:
    page = await c.plane.store.list_sandboxes(tenant_id=tenant_id, limit=1000)
    return [s.id for s in page.items if s.state is not SandboxState.DELETED]


async def test_racing_creates_take_exactly_the_cpus_the_quota_allows(fleet: Cluster) -> None:
    """Twenty creates of 1.5 CPUs race for a quota of 10: six fit (9 CPUs), the rest are 429 naming
    ``max_cpus``. Half of them carry an Idempotency-Key (the store's other create path), some may wait."""
    c = fleet
    tid, auth = await tenant(c, "racer", max_cpus=10)

    async def one(i: int) -> httpx.Response:
        body: dict[str, Any] = {"cpus": 1.5, "memory_mb": 256}
        headers = dict(auth)
        if i % 2:
            headers["Idempotency-Key"] = f"k-{i}"
        if i % 3 == 0:
            body["wait_s"] = 30
        return await c.http.post("/v1/sandboxes", json=body, headers=headers)

    answers = await asyncio.gather(*(one(i) for i in range(20)))
    statuses = sorted(r.status_code for r in answers)
    assert statuses == [201] * 6 + [429] * 14, [r.text for r in answers if r.status_code not in (201, 429)]
    for r in answers:
        if r.status_code == 429:
            err = r.json()["error"]
            assert err["code"] == "tenant_over_quota"
            assert err["details"]["limit"] == "max_cpus" and err["details"]["allowed"] == 10
    assert len(await live(c, tid)) == 6
    assert await c.plane.store.usage(tid) == Usage(6, 6 * 256, 9.0)
    assert await c.plane.store.audit() == []


async def test_parked_creates_hold_their_cpus(tmp_path: Path) -> None:
    """Creates parked in ``waiting_capacity`` count against the quota as placed ones do: a tenant cannot
    queue more CPU than its quota while the fleet is full."""
    c = await make_cluster(tmp_path, hosts=1, memory_mb=4096, cpus=HOST_CPUS)
    c.plane.waiting.poll_s = 0.005
    try:
        # Fill the one host's memory with another tenant's sandboxes.
        while (await c.http.post("/v1/sandboxes", json={"memory_mb": 512}, headers=H)).status_code == 201:
            pass
        tid, auth = await tenant(c, "queued", max_cpus=3)
        tasks = [
            asyncio.create_task(
                c.http.post("/v1/sandboxes", json={"cpus": 1, "memory_mb": 512, "wait_s": 300}, headers=auth)
            )
            for _ in range(3)
        ]
        for _ in range(2000):
            page = await c.plane.store.list_sandboxes(
                tenant_id=tid, state=SandboxState.WAITING_CAPACITY, limit=10
            )
            if len(page.items) == 3:
                break
            await asyncio.sleep(0.002)
        assert len(page.items) == 3 and not any(t.done() for t in tasks)
        over = await c.http.post(
            "/v1/sandboxes", json={"cpus": 0.5, "memory_mb": 512, "wait_s": 300}, headers=auth
        )
        assert over.status_code == 429 and over.json()["error"]["details"]["limit"] == "max_cpus"
        assert (await c.plane.store.usage(tid)).cpus == 3.0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await c.close()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cpus": HOST_CPUS + 0.5}, "cpus"),
        ({"cpus": 1000.0}, "cpus"),
        ({"cpus": HOST_CPUS + 1, "wait_s": 60}, "cpus"),  # never parked
        ({"memory_mb": HOST_MB + 1}, "memory_mb"),
        ({"memory_mb": 4 * HOST_MB, "wait_s": 60}, "memory_mb"),
    ],
)
async def test_more_than_the_largest_host_is_422_and_leaves_nothing(
    fleet: Cluster, body: dict[str, Any], field: str
) -> None:
    c = fleet
    tid, auth = await tenant(c, "greedy")
    before = await c.plane.store.usage(tid)
    r = await c.http.post("/v1/sandboxes", json=body, headers=auth)
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_request" and err["details"]["field"] == field
    assert err["details"]["largest_host"] == (HOST_CPUS if field == "cpus" else HOST_MB)
    assert await live(c, tid) == []
    assert await c.plane.store.usage(tid) == before == Usage(0, 0, 0.0)
    # What the largest host can take is still taken.
    exact = {"cpus": HOST_CPUS} if field == "cpus" else {"memory_mb": HOST_MB}
    assert (await c.http.post("/v1/sandboxes", json=exact, headers=auth)).status_code == 201


async def test_a_batch_with_a_member_beyond_every_host_is_refused_whole(fleet: Cluster) -> None:
    c = fleet
    tid, auth = await tenant(c, "batcher")
    r = await c.http.post(
        "/v1/sandboxes/batch", json={"count": 5, "spec": {"cpus": HOST_CPUS * 2}}, headers=auth
    )
    assert r.status_code == 422 and r.json()["error"]["details"]["field"] == "cpus", r.text
    assert await live(c, tid) == []
    assert await c.plane.store.usage(tid) == Usage(0, 0, 0.0)
    assert await c.plane.store.outstanding() == {}


async def test_e2b_create_of_a_template_wider_than_every_host_is_422(fleet: Cluster) -> None:
    c = fleet
    tid, auth = await tenant(c, "e2b")
    made = await c.http.post("/v1/templates", json={"name": "wide", "cpus": HOST_CPUS * 4}, headers=H)
    assert made.status_code == 201, made.text
    r = await c.http.post(
        "/sandboxes", json={"templateID": "wide"}, headers={"X-API-Key": auth["Authorization"][7:]}
    )
    assert r.status_code == 422, r.text
    assert r.json()["error_code"] == "invalid_request" and "cpus" in r.json()["message"]
    assert await live(c, tid) == []


async def test_with_no_host_known_the_refusal_is_no_healthy_hosts(tmp_path: Path) -> None:
    """Nothing is known to be too small when no host has reported: the usual 503, not a 422."""
    c = await make_cluster(tmp_path, hosts=0)
    try:
        r = await c.http.post("/v1/sandboxes", json={"cpus": 1000.0}, headers=H)
        assert r.status_code == 503 and r.json()["error"]["code"] == "no_healthy_hosts", r.text
        assert (await c.plane.store.list_sandboxes(limit=10)).items == []
    finally:
        await c.close()


@pytest.mark.parametrize("bad", ["0", "-1", "NaN", "Infinity", "1e400", "true", '"4"', "1e10"])
async def test_the_admin_api_refuses_a_cpu_quota_that_is_not_a_positive_finite_number(
    fleet: Cluster, bad: str
) -> None:
    c = fleet
    for method, path, prefix in (
        ("POST", "/v1/tenants", '{"name": "odd", '),
        ("PATCH", "/v1/tenants/default", "{"),
    ):
        content = f'{prefix}"max_cpus": {bad}}}'
        r = await c.http.request(
            method, path, content=content, headers={**H, "Content-Type": "application/json"}
        )
        assert r.status_code == 422, (method, bad, r.text)
        assert r.json()["error"]["code"] == "invalid_request"
    assert await c.plane.store.get_tenant_by_name("odd") is None


async def test_an_operator_changes_the_cpu_quota(fleet: Cluster) -> None:
    c = fleet
    tid, auth = await tenant(c, "growing", max_cpus=2)
    assert (await c.http.post("/v1/sandboxes", json={"cpus": 2}, headers=auth)).status_code == 201
    assert (await c.http.post("/v1/sandboxes", json={"cpus": 0.25}, headers=auth)).status_code == 429
    r = await c.http.patch("/v1/tenants/growing", json={"max_cpus": 4.5}, headers=H)
    assert r.status_code == 200 and r.json()["max_cpus"] == 4.5 and r.json()["max_sandboxes"] == 1000
    assert (await c.http.post("/v1/sandboxes", json={"cpus": 2.5}, headers=auth)).status_code == 201
    assert (await c.http.patch("/v1/tenants/nobody", json={"max_cpus": 1}, headers=H)).status_code == 404
    assert (await c.http.patch("/v1/tenants/growing", json={"max_cpus": 1}, headers=auth)).status_code == 403
    listed = (await c.http.get("/v1/tenants", headers=H)).json()["tenants"]
    assert next(t for t in listed if t["id"] == tid)["max_cpus"] == 4.5
    assert math.isclose((await c.plane.store.usage(tid)).cpus, 4.5)
