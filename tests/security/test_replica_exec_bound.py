"""The replica's own count of a tenant's execs on one sandbox, taken before the store is read: past
it, 429 ``too_many_concurrent`` naming the sandbox scope; it is keyed by the tenant that named the
id, so naming another tenant's sandbox never takes that tenant's slots (and still answers 404)."""

from __future__ import annotations

import json

from corral.core.inflight import DEFAULT_EXECS_PER_SANDBOX

from .conftest import ADMIN, Cluster


async def _tenant(c: Cluster, name: str) -> tuple[str, str, str]:
    r = await c.http.post("/v1/tenants", json={"name": name}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    token, tenant_id = str(r.json()["token"]), str(r.json()["id"])
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(token))
    assert r.status_code == 201, r.text
    return token, tenant_id, str(r.json()["id"])


async def test_a_tenants_execs_past_the_sandbox_bound_are_refused_and_no_one_elses(cluster: Cluster) -> None:
    token_a, tenant_a, sandbox_a = await _tenant(cluster, "alice")
    token_b, tenant_b, sandbox_b = await _tenant(cluster, "bob")
    bound = cluster.plane.sandboxes.sandbox_calls
    assert bound is not None and bound.limit == DEFAULT_EXECS_PER_SANDBOX
    # Alice's sandbox as busy as its bound allows, through this replica (execs in flight).
    held = f"{tenant_a}/{sandbox_a}"
    for _ in range(bound.limit):
        assert bound.enter(held) is None
    try:
        body = {"command": ["true"]}
        r = await cluster.http.post(
            f"/v1/sandboxes/{sandbox_a}/exec", json=body, headers=cluster.as_(token_a)
        )
        assert r.status_code == 429 and r.headers["Retry-After"] == "1", r.text
        err = r.json()["error"]
        assert err["code"] == "too_many_concurrent"
        assert err["details"] == {"scope": "sandbox", "limit": bound.limit, "in_flight": bound.limit}
        # Bob naming Alice's sandbox holds none of her slots: not found, as for a made-up id.
        r = await cluster.http.post(
            f"/v1/sandboxes/{sandbox_a}/exec", json=body, headers=cluster.as_(token_b)
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        # Bob's own sandbox and the admin are not counted against Alice's.
        r = await cluster.http.post(
            f"/v1/sandboxes/{sandbox_b}/exec", json=body, headers=cluster.as_(token_b)
        )
        assert r.status_code == 200, r.text
        r = await cluster.http.post(f"/v1/sandboxes/{sandbox_a}/exec", json=body, headers=cluster.as_(ADMIN))
        assert r.status_code == 200, r.text
    finally:
        for _ in range(bound.limit):
            bound.leave(held)
    r = await cluster.http.post(
        f"/v1/sandboxes/{sandbox_a}/exec", json={"command": ["true"]}, headers=cluster.as_(token_a)
    )
    assert r.status_code == 200, r.text  # a slot freed: served again
    assert f"{tenant_b}/{sandbox_a}" not in bound._held  # nothing of Bob's is left counted


async def test_a_streamed_exec_counts_against_the_same_bounds_and_hands_its_slots_back(
    cluster: Cluster,
) -> None:
    token_a, tenant_a, sandbox_a = await _tenant(cluster, "alice")
    token_b, _, _ = await _tenant(cluster, "bob")
    bound = cluster.plane.sandboxes.sandbox_calls
    assert bound is not None
    path, body = f"/v1/sandboxes/{sandbox_a}/exec/stream", {"command": ["echo", "hi"]}
    held = f"{tenant_a}/{sandbox_a}"
    for _ in range(bound.limit):
        assert bound.enter(held) is None
    try:
        r = await cluster.http.post(path, json=body, headers=cluster.as_(token_a))
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_concurrent", r.text
    finally:
        for _ in range(bound.limit):
            bound.leave(held)
    # Another tenant's id is not found, before any stream begins; bad input is a 422, not a stream.
    r = await cluster.http.post(path, json=body, headers=cluster.as_(token_b))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await cluster.http.post(path, json={"command": ["a\x00b"]}, headers=cluster.as_(token_a))
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    # Served: its lines, its result last, and every slot it held handed back.
    r = await cluster.http.post(path, json=body, headers=cluster.as_(token_a))
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert lines[-1]["result"]["exit_code"] == 0
    assert held not in bound._held and tenant_a not in cluster.plane.sandboxes.calls._held
