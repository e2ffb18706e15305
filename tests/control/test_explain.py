"""Placement explanations: what a create recorded about its decision, checked against the store."""

from __future__ import annotations

from pathlib import Path

from corral.core import candidate_limit

from .conftest import ADMIN, Cluster, make_cluster


async def test_explain_names_the_real_candidates_and_the_stores_choice(cluster: Cluster) -> None:
    r = await cluster.http.post("/v1/sandboxes", json={}, headers=cluster.as_(ADMIN))
    assert r.status_code == 201
    sb = r.json()
    r = await cluster.http.get(f"/v1/sandboxes/{sb['id']}/placement", headers=cluster.as_(ADMIN))
    assert r.status_code == 200
    ex = r.json()
    record = await cluster.plane.store.get_sandbox(sb["id"])
    assert record is not None and record.reservation_id is not None
    res = await cluster.plane.store.get_reservation(record.reservation_id)
    assert res is not None
    # the explanation, the sandbox and the durable reservation agree on the host
    assert ex["outcome"] == "placed"
    assert ex["host"] == sb["host_id"] == record.host_id == res.host_id
    assert ex["reservation_id"] == record.reservation_id
    (attempt,) = ex["attempts"]
    fleet = {a.id for a in cluster.fleet.agents}
    hosts = [c["host"] for c in attempt["candidates"]]
    # K sampled hosts of this fleet, all feasible on an empty fleet, best score first
    assert len(hosts) == len(set(hosts)) == candidate_limit(len(fleet))
    assert set(hosts) <= fleet
    scores = [c["score"] for c in attempt["candidates"]]
    assert scores == sorted(scores, reverse=True)
    assert attempt["placer_choice"] == hosts[0]
    assert attempt["store_choice"] == res.host_id and res.host_id in attempt["offered_to_store"]
    assert set(attempt["offered_to_store"]) <= set(hosts)
    assert attempt["charge_mb"] == res.memory_mb
    assert ex["request"]["memory_mb"] == 512 and "why" in ex


async def test_a_tenant_reads_only_its_own_explanations(cluster: Cluster) -> None:
    acme = (await cluster.http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))).json()
    globex = (
        await cluster.http.post("/v1/tenants", json={"name": "globex"}, headers=cluster.as_(ADMIN))
    ).json()
    r = await cluster.http.post("/v1/sandboxes", json={}, headers=cluster.as_(acme["token"]))
    sid = r.json()["id"]
    path = f"/v1/sandboxes/{sid}/placement"
    assert (await cluster.http.get(path, headers=cluster.as_(acme["token"]))).status_code == 200
    assert (await cluster.http.get(path, headers=cluster.as_(ADMIN))).status_code == 200
    r = await cluster.http.get(path, headers=cluster.as_(globex["token"]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert (await cluster.http.get(path)).status_code == 401
    for bad in ["sb-nope", "x" * 5000, "%00", "..%2F..%2Fetc"]:
        r = await cluster.http.get(f"/v1/sandboxes/{bad}/placement", headers=cluster.as_(ADMIN))
        assert r.status_code == 404, (bad, r.text)


async def test_a_refusal_carries_the_breakdown_in_details(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=3, memory_mb=8192)
    try:
        body = {"memory_mb": 2048, "stateful": True}
        for _ in range(9):  # 3 hosts x (8192 - 2048 headroom) / 2048
            assert (await c.http.post("/v1/sandboxes", json=body, headers=c.as_(ADMIN))).status_code == 201
        r = await c.http.post("/v1/sandboxes", json=body, headers=c.as_(ADMIN))
        assert r.status_code == 503
        ex = r.json()["error"]["details"]["placement"]
        assert ex["outcome"] == "refused" and ex["refusal"]["code"] == "no_capacity"
        rejected = {x["host"]: x["filter"] for x in ex["refusal"]["rejected"]}
        assert rejected == {a.id: "does_not_fit" for a in c.fleet.agents}
        assert ex["refusal"]["checked"] == 3
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_corral_explain_renders_the_recorded_decision(cluster: Cluster) -> None:
    from rich.console import Console

    from corral.client.cli import render_explanation

    sb = (await cluster.http.post("/v1/sandboxes", json={}, headers=cluster.as_(ADMIN))).json()
    ex = (await cluster.http.get(f"/v1/sandboxes/{sb['id']}/placement", headers=cluster.as_(ADMIN))).json()
    console = Console(record=True, width=200)
    render_explanation(ex, console)
    text = console.export_text()
    assert f"placed on {sb['host_id']}" in text
    for c in ex["attempts"][0]["candidates"]:
        assert c["host"] in text and f"{c['score']:.4f}" in text
    assert "store chose" in text


async def test_a_batch_keeps_each_members_decision(cluster: Cluster) -> None:
    r = await cluster.http.post(
        "/v1/sandboxes/batch", json={"count": 5, "spec": {"memory_mb": 1024}}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 201, r.text
    for sb in r.json()["sandboxes"]:
        ex = (
            await cluster.http.get(f"/v1/sandboxes/{sb['id']}/placement", headers=cluster.as_(ADMIN))
        ).json()
        record = await cluster.plane.store.get_sandbox(sb["id"])
        assert record is not None
        assert ex["outcome"] == "placed" and ex["host"] == sb["host_id"] == record.host_id
        assert ex["reservation_id"] == record.reservation_id
        (attempt,) = ex["attempts"]
        assert attempt["store_choice"] == attempt["placer_choice"] == sb["host_id"]
        assert sb["host_id"] in [c["host"] for c in attempt["candidates"]]


async def test_a_refused_batch_explains_the_member_that_did_not_fit(tmp_path: Path) -> None:
    c = await make_cluster(tmp_path, hosts=2, memory_mb=8192)
    try:
        r = await c.http.post(
            "/v1/sandboxes/batch",
            json={"count": 7, "spec": {"memory_mb": 2048, "stateful": True}},  # room for 6
            headers=c.as_(ADMIN),
        )
        assert r.status_code == 503
        ex = r.json()["error"]["details"]["placement"]
        assert ex["outcome"] == "refused" and ex["attempts"] == []
        assert {x["host"] for x in ex["refusal"]["rejected"]} == {a.id for a in c.fleet.agents}
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


async def test_a_host_the_cached_view_lacks_is_seen_by_the_next_create(cluster: Cluster) -> None:
    import random

    from corral.agent import Agent, AgentConfig
    from corral.runtime.sim import SimRuntime

    before = await cluster.plane.view.get()
    assert "host-new" not in before.records
    newcomer = Agent(
        AgentConfig("host-new", 32768, 16.0),
        SimRuntime(cluster.clock, random.Random(5)),
        clock=cluster.clock,
        sink=cluster.plane.heartbeat_reply,
    )
    await newcomer.beat()
    # no clock movement: the cached view is still within its TTL, yet the newcomer is in the next read
    after = await cluster.plane.view.get()
    assert "host-new" in after.records and after.generation > before.generation
