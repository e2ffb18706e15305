"""The edges of hostile input on both APIs get a 4xx in the API's own error shape, never a 5xx or a
traceback: JSON nested past any parser's depth, numbers past any type's range, NaN and Infinity,
zero, negative and vanishing timeouts, cursors the store never issued, and ids with NUL bytes on every
route that names a sandbox."""

from __future__ import annotations

import itertools
from typing import Any

import httpx
import pytest

from corral.api.app import create_app

from .conftest import ADMIN, Cluster
from .route_table import e2b_app, operations

DEEP_ARRAY = b"[" * 400_000 + b"]" * 400_000  # under the body cap, far past any recursion limit
DEEP_OBJECT = b'{"a":' * 150_000 + b"1" + b"}" * 150_000
HUGE_INT = b"9" * 5000  # past Python's 4,300 digits for an int
SANDBOX = "{sandbox}"  # replaced by the caller's own sandbox's id


async def _tenant(c: Cluster) -> tuple[str, str]:
    r = await c.http.post("/v1/tenants", json={"name": "hostile"}, headers=c.as_(ADMIN))
    assert r.status_code == 201, r.text
    token = str(r.json()["token"])
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(token))
    assert r.status_code == 201, r.text
    return token, str(r.json()["id"])


def _headers(api: str, token: str) -> dict[str, str]:
    auth = {"Authorization": f"Bearer {token}"} if api == "corral" else {"X-API-KEY": token}
    return {**auth, "Content-Type": "application/json"}


def refused_in_shape(r: httpx.Response, api: str, statuses: set[int] | None = None) -> str:
    """A 4xx (among ``statuses`` if given) in the API's error shape; its stable code."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    if statuses is not None:
        assert r.status_code in statuses, (r.status_code, r.text[:300])
    body = r.json()
    if api == "corral":
        assert set(body) == {"error"}, body
        code = body["error"]["code"]
    else:
        assert body["code"] == r.status_code, body
        code = body["error_code"]
    assert isinstance(code, str) and code.isidentifier(), body
    return str(code)


BODIES: list[tuple[str, str, str, bytes]] = [
    # api, method, path, body
    *[
        (api, "POST", path, body)
        for api, path in [
            ("corral", "/v1/sandboxes"),
            ("corral", "/v1/sandboxes/batch"),
            ("corral", f"/v1/sandboxes/{SANDBOX}/exec"),
            ("e2b", "/v2/sandboxes"),
            ("e2b", "/sandboxes"),
            ("e2b", f"/sandboxes/{SANDBOX}/timeout"),
            ("e2b", f"/sandboxes/{SANDBOX}/connect"),
        ]
        for body in (DEEP_ARRAY, DEEP_OBJECT)
    ],
    ("corral", "POST", "/v1/sandboxes", b'{"memory_mb": ' + HUGE_INT + b"}"),
    ("corral", "POST", "/v1/sandboxes", b'{"memory_mb": 1e400}'),
    ("corral", "POST", "/v1/sandboxes", b'{"cpus": NaN}'),
    ("corral", "POST", "/v1/sandboxes", b'{"cpus": -Infinity}'),
    ("corral", "POST", "/v1/sandboxes", b'{"ttl_seconds": Infinity}'),
    ("corral", "POST", "/v1/sandboxes", b'{"ttl_seconds": 0}'),
    ("corral", "POST", "/v1/sandboxes", b'{"ttl_seconds": -1e-300}'),
    ("corral", "POST", "/v1/sandboxes", b'{"wait_s": NaN}'),
    ("corral", "POST", "/v1/sandboxes/batch", b'{"count": ' + HUGE_INT + b"}"),
    ("corral", "POST", "/v1/sandboxes/batch", b'{"count": 1e400}'),
    ("corral", "POST", f"/v1/sandboxes/{SANDBOX}/exec", b'{"command": "true", "timeout_s": NaN}'),
    ("corral", "POST", f"/v1/sandboxes/{SANDBOX}/exec", b'{"command": "true", "timeout_s": 0}'),
    ("corral", "POST", f"/v1/sandboxes/{SANDBOX}/exec", b'{"command": "true", "timeout_s": -5}'),
    ("corral", "POST", f"/v1/sandboxes/{SANDBOX}/exec", b'{"command": "true", "timeout_s": 1e400}'),
    (
        "corral",
        "POST",
        f"/v1/sandboxes/{SANDBOX}/exec",
        b'{"command": "true", "timeout_s": ' + HUGE_INT + b"}",
    ),
    ("e2b", "POST", "/v2/sandboxes", b'{"timeout": 0}'),
    ("e2b", "POST", "/v2/sandboxes", b'{"timeout": -1}'),
    ("e2b", "POST", "/v2/sandboxes", b'{"timeout": 1e-9}'),
    ("e2b", "POST", "/v2/sandboxes", b'{"timeout": NaN}'),
    ("e2b", "POST", "/v2/sandboxes", b'{"timeout": ' + HUGE_INT + b"}"),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/timeout", b'{"timeout": -1}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/timeout", b'{"timeout": 1e-9}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/timeout", b'{"timeout": NaN}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/timeout", b'{"timeout": Infinity}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/connect", b'{"timeout": 0}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/connect", b'{"timeout": 1e-9}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/connect", b'{"timeout": NaN}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/connect", b'{"timeout": -1}'),
    ("e2b", "POST", f"/sandboxes/{SANDBOX}/resume", b'{"timeout": 0}'),
]


async def test_bodies_at_the_edges_are_refused(cluster: Cluster) -> None:
    token, sid = await _tenant(cluster)
    for api, method, path, body in BODIES:
        r = await cluster.http.request(
            method, path.replace(SANDBOX, sid), content=body, headers=_headers(api, token)
        )
        assert r.status_code in (400, 422), (method, path, body[:40], r.status_code, r.text[:300])
        refused_in_shape(r, api)
    # Nothing was done meanwhile: the sandbox is there, running, and alone.
    r = await cluster.http.get("/v1/sandboxes", headers=_headers("corral", token))
    assert [(s["id"], s["state"]) for s in r.json()["sandboxes"]] == [(sid, "running")]


CURSORS = ["garbage", "%00%ff", "MTIz", "A" * 1000, "-1", "0:0", "sb-", "\u00e9\u00e9"]


async def test_a_cursor_the_store_never_issued_is_a_422_on_both_apis(cluster: Cluster) -> None:
    token, _ = await _tenant(cluster)
    for (api, path, name), cursor in itertools.product(
        [
            ("corral", "/v1/sandboxes", "cursor"),
            ("e2b", "/v2/sandboxes", "nextToken"),
            ("e2b", "/sandboxes", "nextToken"),
        ],
        CURSORS,
    ):
        r = await cluster.http.get(path, params={name: cursor}, headers=_headers(api, token))
        assert refused_in_shape(r, api, {422}) == "invalid_request"


BAD_IDS = ["%00", "sb-%00", "sb-0003b9aca004cafb18331c8%00", "%00%00%00%00", "x" * 5000, "..%2F..%2Fetc"]


async def test_a_nul_id_is_a_404_on_every_sandbox_route_of_both_apis(cluster: Cluster) -> None:
    token, sid = await _tenant(cluster)
    tried = 0
    for api, app in (("corral", create_app(cluster.plane, manage=False)), ("e2b", e2b_app())):
        for op in operations(app):
            if op.params != ("sandbox_id",):
                continue
            for bad in BAD_IDS:
                kw: dict[str, Any] = {} if op.body is None else {"json": op.body}
                path = op.path.replace("{sandbox_id}", bad)
                r = await cluster.http.request(op.method, path, headers=_headers(api, token), **kw)
                assert refused_in_shape(r, api, {400, 404, 422}), (op, bad)
                tried += 1
    assert tried >= 12 * len(BAD_IDS)
    # The data plane answers an unknown id as E2B's proxy does (502, in E2B's shape).
    for bad in ("\x01", "x" * 5000, "../../x", "sb-\t"):
        r = await cluster.http.post(
            "/process.Process/List",
            content=b"{}",
            headers={"E2b-Sandbox-Id": bad, "X-API-KEY": token, "Content-Type": "application/json"},
        )
        assert r.status_code == 502 and r.json()["error_code"] == "not_found", r.text[:300]
    r = await cluster.http.get(f"/v1/sandboxes/{sid}", headers=_headers("corral", token))
    assert r.status_code == 200 and r.json()["state"] == "running"


@pytest.mark.parametrize("route", ["timeout", "connect"])
async def test_a_timeout_past_any_date_is_refused_not_stored(cluster: Cluster, route: str) -> None:
    token, sid = await _tenant(cluster)
    e2b, own = _headers("e2b", token), _headers("corral", token)
    set_ = await cluster.http.post(f"/sandboxes/{sid}/{route}", json={"timeout": 10**12}, headers=e2b)
    assert set_.status_code < 500, set_.text
    for path, headers in [
        (f"/v1/sandboxes/{sid}", own),
        (f"/sandboxes/{sid}", e2b),
        ("/v1/sandboxes", own),
        ("/v2/sandboxes", e2b),
        ("/v1/sandboxes", _headers("corral", ADMIN)),
    ]:
        try:
            r = await cluster.http.get(path, headers=headers)
        except Exception as exc:  # the ASGI transport hands on what the app raised
            pytest.fail(f"GET {path} raised {exc!r}")
        assert r.status_code < 500, (path, r.status_code, r.text[:300])
    # Refused: an expiry past any date would break every later read of the record.
    refused_in_shape(set_, "e2b", {422})
