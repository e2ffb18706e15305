"""The dashboard's routes and the document it draws: admin-only, a cookie that reads and does nothing
else, and numbers that are the store's (the same as ``/v1/hosts``)."""

from __future__ import annotations

import math
import time

import pytest

from corral.api.dashboard import COOKIE, _sign
from corral.control.fleetview import quantile

from .conftest import ADMIN, AGENT, Cluster


async def login(c: Cluster, token: str) -> tuple[int, str | None]:
    r = await c.http.post(
        "/dashboard/login",
        content=f"token={token}".encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    return r.status_code, r.headers.get("set-cookie")


async def test_login_trades_an_admin_token_for_a_read_only_cookie(cluster: Cluster) -> None:
    r = await cluster.http.get("/dashboard")
    assert r.status_code == 200 and 'action="/dashboard/login"' in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert (await cluster.http.get("/dashboard/data.json")).status_code == 401

    tenant = (
        await cluster.http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))
    ).json()
    for bad in ["wrong-token-0123456789", tenant["token"], AGENT, "", "%00" * 10]:
        status, cookie = await login(cluster, bad)
        assert status == 401 and cookie is None, bad
    r = await cluster.http.post("/dashboard/login", content=b"token=" + b"x" * 10_000)
    assert r.status_code == 413

    status, cookie = await login(cluster, ADMIN)
    assert status == 303 and cookie is not None
    attrs = cookie.lower()
    assert "httponly" in attrs and "samesite=strict" in attrs and "path=/dashboard" in attrs
    value = cookie.split(";")[0].split("=", 1)[1]
    jar = {"Cookie": f"{COOKIE}={value}"}
    page = await cluster.http.get("/dashboard", headers=jar)
    assert page.status_code == 200 and 'id="hosts"' in page.text
    assert (await cluster.http.get("/dashboard/data.json", headers=jar)).status_code == 200
    # the cookie reads the dashboard and nothing else
    assert (await cluster.http.get("/v1/hosts", headers=jar)).status_code == 401
    assert (await cluster.http.post("/v1/sandboxes", json={}, headers=jar)).status_code == 401
    assert (
        await cluster.http.get("/v1/sandboxes", headers={"Authorization": f"Bearer {value}"})
    ).status_code == 401


@pytest.mark.parametrize(
    "value",
    ["", "garbage", "99999999999.deadbeef", f"{int(time.time()) - 10}", "1." + "0" * 64, "9" * 200],
    # Named, not by value: one value is the clock's, and every process of the suite must collect the
    # same test ids.
    ids=["empty", "garbage", "far-future-unsigned", "expired-unsigned", "long-signature", "overlong"],
)
async def test_forged_or_expired_cookies_are_refused(cluster: Cluster, value: str) -> None:
    r = await cluster.http.get("/dashboard/data.json", headers={"Cookie": f"{COOKIE}={value}"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"


async def test_an_expired_signed_cookie_is_refused(cluster: Cluster) -> None:
    app = cluster.http._transport.app  # type: ignore[attr-defined]
    key = app.state.dashboard_key
    expired = _sign(key, int(time.time()) - 1)
    fresh = _sign(key, int(time.time()) + 60)
    assert (
        await cluster.http.get("/dashboard/data.json", headers={"Cookie": f"{COOKIE}={expired}"})
    ).status_code == 401
    assert (
        await cluster.http.get("/dashboard/data.json", headers={"Cookie": f"{COOKIE}={fresh}"})
    ).status_code == 200


async def test_assets_ship_in_the_package(cluster: Cluster) -> None:
    for name in ["uPlot.iife.min.js", "uPlot.min.css", "dashboard.js", "dashboard.css", "uPlot.LICENSE"]:
        r = await cluster.http.get(f"/dashboard/assets/{name}")
        assert r.status_code == 200 and len(r.content) > 100, name
    for name in ["../app.py", "..%2Fapp.py", "login.html", "nope.js", "%00"]:
        assert (await cluster.http.get(f"/dashboard/assets/{name}")).status_code == 404, name


async def test_the_document_shows_what_the_store_holds(cluster: Cluster) -> None:
    ids = []
    for mb in (512, 1024, 2048):
        r = await cluster.http.post("/v1/sandboxes", json={"memory_mb": mb}, headers=cluster.as_(ADMIN))
        ids.append(r.json())
    await cluster.beat()
    # one refusal, counted by reason
    r = await cluster.http.post(
        "/v1/sandboxes", json={"memory_mb": 32 * 1024, "stateful": True}, headers=cluster.as_(ADMIN)
    )
    assert r.status_code == 503
    doc = (await cluster.http.get("/dashboard/data.json", headers=cluster.as_(ADMIN))).json()
    api = {
        h["id"]: h for h in (await cluster.http.get("/v1/hosts", headers=cluster.as_(ADMIN))).json()["hosts"]
    }
    assert [h["id"] for h in doc["hosts"]] == sorted(api)
    for h in doc["hosts"]:
        a = api[h["id"]]
        assert (h["sandboxes"], h["memory_mb_admittable"], h["reserved_mb"], h["resident_mb"]) == (
            a["sandboxes"],
            a["memory_mb_admittable"],
            a["reserved_mb"],
            a["memory_mb_used"],
        )
    by_host: dict[str, int] = {}
    for sb in ids:
        by_host[sb["host_id"]] = by_host.get(sb["host_id"], 0) + sb["memory_mb"]
    assert {h["id"]: h["committed_mb"] for h in doc["hosts"] if h["committed_mb"]} == by_host
    assert doc["fleet"]["placements_60s"] == 3 and doc["fleet"]["sandboxes"] == 3
    assert doc["fleet"]["max"] == max(a["sandboxes"] for a in api.values())
    assert doc["requests"]["create_latency"]["count"] == 3
    assert doc["requests"]["replica"] == "replica-test"
    assert doc["requests"]["refusals"] == {"no_capacity": 1}
    # placements leave the 60 s window as time passes
    await cluster.advance(61)
    doc = (await cluster.http.get("/dashboard/data.json", headers=cluster.as_(ADMIN))).json()
    assert doc["fleet"]["placements_60s"] == 0 and doc["fleet"]["sandboxes"] == 3


def test_quantile_reads_a_cumulative_histogram() -> None:
    b = [(0.1, 50.0), (1.0, 90.0), (10.0, 100.0), (math.inf, 100.0)]
    assert quantile(b, 0.5) == pytest.approx(0.1)
    assert quantile(b, 0.7) == pytest.approx(0.1 + 0.9 * 20 / 40)
    assert quantile(b, 0.99) == pytest.approx(1.0 + 9.0 * 9 / 10)
    assert quantile([(1.0, 0.0), (math.inf, 0.0)], 0.5) is None
    assert quantile([(1.0, 0.0), (math.inf, 4.0)], 0.5) == 1.0  # beyond the last bound: that bound


async def test_a_sign_in_link_opens_the_dashboard_and_nothing_else(cluster: Cluster) -> None:
    """For a browser that cannot type a token (a headless one): ``corral dashboard`` prints the link."""
    tenant = (
        await cluster.http.post("/v1/tenants", json={"name": "acme"}, headers=cluster.as_(ADMIN))
    ).json()
    for bad in [tenant["token"], "wrong-token-0123456789"]:
        assert (await cluster.http.post("/dashboard/link", headers=cluster.as_(bad))).status_code == 401
    r = await cluster.http.post("/dashboard/link", headers=cluster.as_(ADMIN))
    assert r.status_code == 200 and r.json()["expires_in_s"] == 300
    url = r.json()["url"]
    assert "/dashboard/open?link=" in url
    value = url.split("link=", 1)[1]
    # The link is not a cookie, and a cookie is not a link; a forged or stale link opens nothing.
    jar = {"Cookie": f"{COOKIE}={value}"}
    assert (await cluster.http.get("/dashboard/data.json", headers=jar)).status_code == 401
    key = cluster.http._transport.app.state.dashboard_key  # type: ignore[attr-defined]
    stale = _sign(key, int(time.time()) - 1, "dashboard-link")
    for bad in [stale, value[:-1] + ("0" if value[-1] != "0" else "1"), ""]:
        assert (await cluster.http.get("/dashboard/open", params={"link": bad})).status_code == 401
    opened = await cluster.http.get("/dashboard/open", params={"link": value})
    assert opened.status_code == 303 and opened.headers["location"] == "/dashboard"
    cookie = opened.headers["set-cookie"].split(";")[0].split("=", 1)[1]
    jar = {"Cookie": f"{COOKIE}={cookie}"}
    assert (await cluster.http.get("/dashboard/data.json", headers=jar)).status_code == 200
    assert (await cluster.http.get("/v1/hosts", headers=jar)).status_code == 401
    # A tool reads the page's data with the admin token in its header, no cookie.
    assert (await cluster.http.get("/dashboard/data.json", headers=cluster.as_(ADMIN))).status_code == 200
