"""Egress policy through the API: kept on the record and answered, carried to the host's start,
replaced on a running sandbox; what cannot be enforced (hostnames, IPv6, lists without an interface)
is a 422 with a stable code, another tenant's sandbox a 404."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.codes import ErrorCode

from .conftest import ADMIN, Cluster, make_cluster


@pytest.fixture
async def cluster(tmp_path: Path):  # type: ignore[no-untyped-def]
    c = await make_cluster(tmp_path, hosts=2, memory_mb=8192)
    yield c
    await c.close()


async def test_a_policy_is_kept_answered_sent_and_replaced(cluster: Cluster) -> None:
    h = cluster.as_(ADMIN)
    policy = {"mode": "internet", "allow_out": ["198.51.100.10"], "deny_out": ["0.0.0.0/0"]}
    r = await cluster.http.post("/v1/sandboxes", json={"network": policy}, headers=h)
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    assert r.json()["network"] == {**policy, "allow_out": ["198.51.100.10/32"]}
    plain = await cluster.http.post("/v1/sandboxes", json={}, headers=h)
    assert plain.json()["network"] == {"mode": "none", "allow_out": [], "deny_out": []}
    rec = await cluster.plane.store.get_sandbox(sid)
    assert rec is not None and rec.network is not None
    r = await cluster.http.put(f"/v1/sandboxes/{sid}/network", json={"mode": "internet"}, headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["network"] == {"mode": "internet", "allow_out": [], "deny_out": []}
    got = await cluster.http.get(f"/v1/sandboxes/{sid}", headers=h)
    assert got.json()["network"]["mode"] == "internet"
    # Names in allow_out (the slot's resolver holds them), kept in lower case without the final dot.
    named = {"allow_out": ["PyPI.org.", "*.pythonhosted.org", "198.51.100.10"], "deny_out": ["0.0.0.0/0"]}
    r = await cluster.http.put(f"/v1/sandboxes/{sid}/network", json=named, headers=h)
    assert r.status_code == 200, r.text
    kept = ["198.51.100.10/32", "pypi.org", "*.pythonhosted.org"]
    assert r.json()["network"] == {"mode": "internet", "allow_out": kept, "deny_out": ["0.0.0.0/0"]}


@pytest.mark.parametrize(
    ("network", "code"),
    [
        ({"deny_out": ["pypi.org"]}, ErrorCode.NETWORK_HOSTNAMES_UNSUPPORTED),
        ({"allow_out": ["pypi org"]}, ErrorCode.INVALID_REQUEST),
        ({"deny_out": ["::/0"]}, ErrorCode.INVALID_REQUEST),
        ({"mode": "none", "allow_out": ["1.2.3.4"]}, ErrorCode.INVALID_REQUEST),
        ({"mode": "intranet"}, ErrorCode.INVALID_REQUEST),
        ({"allow_out": ["1.2.3.4"] * 5000}, ErrorCode.INVALID_REQUEST),
        ({"allow_out": [{"cidr": "1.2.3.4"}]}, ErrorCode.INVALID_REQUEST),
        ({"mode": "internet", "extra": True}, ErrorCode.INVALID_REQUEST),
    ],
)
async def test_what_cannot_be_enforced_is_refused(
    cluster: Cluster, network: dict[str, object], code: str
) -> None:
    h = cluster.as_(ADMIN)
    r = await cluster.http.post("/v1/sandboxes", json={"network": network}, headers=h)
    assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
    made = await cluster.http.post("/v1/sandboxes", json={"network": {"mode": "internet"}}, headers=h)
    sid = made.json()["id"]
    r = await cluster.http.put(f"/v1/sandboxes/{sid}/network", json=network, headers=h)
    assert r.status_code == 422 and r.json()["error"]["code"] == code, r.text
    unchanged = await cluster.http.get(f"/v1/sandboxes/{sid}", headers=h)
    assert unchanged.json()["network"]["mode"] == "internet"


async def test_another_tenant_cannot_change_a_policy(cluster: Cluster) -> None:
    h = cluster.as_(ADMIN)
    tokens = []
    for name in ("acme", "globex"):
        r = await cluster.http.post("/v1/tenants", json={"name": name}, headers=h)
        tokens.append(r.json()["token"])
    made = await cluster.http.post(
        "/v1/sandboxes", json={"network": {"deny_out": ["0.0.0.0/0"]}}, headers=cluster.as_(tokens[0])
    )
    assert made.status_code == 201, made.text
    sid = made.json()["id"]
    r = await cluster.http.put(
        f"/v1/sandboxes/{sid}/network", json={"mode": "internet"}, headers=cluster.as_(tokens[1])
    )
    assert r.status_code == 404, r.text
    rec = await cluster.plane.store.get_sandbox(sid)
    assert rec is not None and rec.network is not None and "0.0.0.0/0" in rec.network
