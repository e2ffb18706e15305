"""Events as ``kubectl describe`` reads them (``/api/v1/namespaces/{ns}/events`` with an
``involvedObject`` field selector), derived from the records: an OOM kill its host reported, a
failover recreate and a lost host on an injected clock; and a selector or namespace that is not
the caller's."""

from __future__ import annotations

from typing import Any

from tests.control.test_failover import H, beat_all_but, make, on_host

from .conftest import Cluster

EVENTS = "/api/v1/namespaces/default/events"


async def events_of(c: Cluster, name: str, kind: str = "Sandbox") -> dict[str, dict[str, Any]]:
    selector = f"involvedObject.name={name},involvedObject.namespace=default,involvedObject.kind={kind}"
    r = await c.http.get(EVENTS, params={"fieldSelector": selector, "limit": "500"}, headers=H)
    assert r.status_code == 200, r.text
    out = {e["reason"]: e for e in r.json()["items"]}
    assert all(e["involvedObject"]["name"] == name for e in out.values())
    return out


async def test_oom_kills_failover_and_a_lost_host_become_events(small: Cluster) -> None:
    c = small
    kept = await make(c, name="kept", failover="recreate", memory_mb=512)
    dead = kept["host_id"]
    lost = await on_host(c, dead, memory_mb=512)
    first = await events_of(c, "kept")
    assert set(first) == {"Scheduled"} and f"placed on {dead}" in first["Scheduled"]["message"]

    await c.plane.store.record_oom_kills(dead, {kept["id"]: 3})
    oom = (await events_of(c, "kept"))["OOMKilling"]
    assert oom["type"] == "Warning" and oom["count"] == 3 and "3 process" in oom["message"]

    # The host goes silent past dead_after: the recreate-policy one starts elsewhere, the other is lost.
    c.clock.advance(c.plane.config.timeouts.dead_after_s + 1)
    await beat_all_but(c, dead)
    await c.plane.reconciler.tick()
    now = await events_of(c, "kept")
    assert now["Recreated"]["type"] == "Warning" and now["Recreated"]["count"] == 1
    assert dead not in now["Recreated"]["message"] and "epoch 1" in now["Recreated"]["message"]
    # Its placement is the new one.
    assert "placed on" in now["Scheduled"]["message"] and dead not in now["Scheduled"]["message"]
    gone = await events_of(c, lost["id"])
    assert gone["HostLost"]["type"] == "Warning" and dead in gone["HostLost"]["message"]


async def test_events_follow_the_callers_namespace_and_selectors(small: Cluster) -> None:
    c = small
    await make(c, name="mine", memory_mb=512)
    r = await c.http.post("/v1/tenants", json={"name": "acme"}, headers=H)
    acme = {"Authorization": f"Bearer {r.json()['token']}"}
    assert (await c.http.get(EVENTS, headers=acme)).status_code == 403
    assert (await c.http.get("/api/v1/events", headers=acme)).json()["items"] == []
    # No such object, or another kind of it: none.
    assert await events_of(c, "nosuch") == {}
    assert await events_of(c, "mine", kind="SandboxClaim") == {}
    for bad in ("spec.secret=x", "involvedObject.name in (a"):
        r = await c.http.get(EVENTS, params={"fieldSelector": bad}, headers=H)
        assert r.status_code == 400 and r.json()["kind"] == "Status", r.text
    r = await c.http.get(EVENTS, params={"watch": "1"}, headers=H)
    assert r.status_code == 422 and r.json()["kind"] == "Status", r.text
