"""Another tenant's sandbox is indistinguishable from one that does not exist: on every route of both
APIs that names a sandbox (or a tenant, or a token), tenant A naming tenant B's real one and naming a
made-up one of the same shape get the same status, headers and body, byte for byte once the id is
substituted. The routes are read from the apps themselves (corral's OpenAPI description, the E2B
router's, the data plane's envd router), so a route added later is covered without a word here."""

from __future__ import annotations

import base64
import random
import re
import string
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI

from corral.agent.envd import SANDBOX_HEADER, Envd
from corral.api.app import create_app
from corral.api.requestlog import HEADER as REQUEST_ID

from .conftest import ADMIN, Cluster
from .route_table import Operation, e2b_app, operations

# What each path parameter names. Tenant-owned things are named by tenant B's real one; fleet-wide
# things (hosts, templates, images: an image's route is for agents alone) belong to no tenant, so there
# is nothing of B's to hide.
TENANT_OWNED = {"sandbox_id", "tenant_id", "name", "token_id"}
# An image digest names content, no tenant; a template's build is the operator's, as its template is.
FLEET_WIDE = {"host_id", "template", "digest", "hostname", "build_id"}
# Named within a sandbox (a background command's pid): the victim's real one, the same in both calls,
# so the two differ only by the sandbox they name.
WITHIN_SANDBOX = {"pid"}

_rng = random.Random(22)


def same_shape(real: str) -> str:
    """A made-up id shaped like ``real``: its prefix kept (``sb-``, ``tn_``, ``tok_``), every other
    character replaced by a random one of its class (a digit, a hex letter, any other letter)."""
    prefix = re.match(r"[a-z]{1,4}[-_]", real)
    cut = prefix.end() if prefix else 0

    def like(ch: str) -> str:
        for alphabet in (string.digits, "abcdef", string.ascii_lowercase):
            if ch in alphabet:
                return _rng.choice(alphabet)
        return ch

    return real[:cut] + "".join(like(ch) for ch in real[cut:])


def difference(real: httpx.Response, fake: httpx.Response, real_id: str, fake_id: str) -> str | None:
    """How the answer naming ``real_id`` differs from the one naming ``fake_id``, once substituted."""

    def seen(r: httpx.Response, own: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        swap = (own.encode(), b"<id>")
        headers = [
            (k.lower(), v.replace(*swap)) for k, v in r.headers.raw if k.lower() != REQUEST_ID.encode()
        ]
        return r.status_code, headers, r.content.replace(*swap)

    a, b = seen(real, real_id), seen(fake, fake_id)
    if a == b:
        return None
    return f"real id: {a}\nmade-up id: {b}"


@dataclass
class Tenants:
    a: str  # the attacker's token
    b: str  # the victim's token
    b_tenant: dict[str, str]  # the victim's tenant_id, name and token_id


async def tenants(c: Cluster) -> Tenants:
    tokens, ids = [], []
    for name in ("attacker", "victim"):
        r = await c.http.post("/v1/tenants", json={"name": name}, headers=c.as_(ADMIN))
        assert r.status_code == 201, r.text
        tokens.append(r.json()["token"])
        ids.append(r.json()["id"])
    listed = (await c.http.get("/v1/tokens", headers=c.as_(ADMIN))).json()["tokens"]
    token_id = next(t["id"] for t in listed if t["tenant"] == ids[1])
    return Tenants(tokens[0], tokens[1], {"tenant_id": ids[1], "name": "victim", "token_id": token_id})


async def new_sandbox(c: Cluster, token: str) -> str:
    r = await c.http.post("/v1/sandboxes", json={"memory_mb": 256}, headers=c.as_(token))
    assert r.status_code == 201, r.text
    return str(r.json()["id"])


async def background_command(c: Cluster, token: str, sandbox_id: str) -> str:
    """A command of the sandbox's owner, for the routes that name one by its pid (on the simulated
    runtime a command is over once started; its sandbox keeps it as one that ended)."""
    r = await c.http.post(
        f"/v1/sandboxes/{sandbox_id}/commands", json={"command": ["true"]}, headers=c.as_(token)
    )
    assert r.status_code == 201, r.text
    return str(r.json()["pid"])


async def call(
    http: httpx.AsyncClient, op: Operation, values: dict[str, str], headers: dict[str, str]
) -> httpx.Response:
    path = op.path.format(**values)
    kw: dict[str, Any] = {} if op.body is None else {"json": op.body}
    return await http.request(op.method, path, headers=headers, **kw)


async def _every_route(c: Cluster, http: httpx.AsyncClient, app: FastAPI, auth: str, t: Tenants) -> list[str]:
    """A's call naming B's real things against the same call naming made-up ones, on every operation of
    ``app``; the differences found. ``auth``: how the API takes a token (a header name)."""

    def as_(token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"} if auth == "bearer" else {auth: token}

    problems = []
    ops = operations(app)
    assert any("sandbox_id" in op.params for op in ops), "no sandbox route found: the enumeration broke"
    for op in ops:
        unknown = set(op.params) - TENANT_OWNED - FLEET_WIDE - WITHIN_SANDBOX
        assert not unknown, (
            f"{op.method} {op.path}: classify {unknown} in TENANT_OWNED, FLEET_WIDE or WITHIN_SANDBOX"
        )
        if not set(op.params) & TENANT_OWNED:
            continue
        sandbox = await new_sandbox(c, t.b)  # a fresh one each time: the owner's own call may delete it
        pid = await background_command(c, t.b, sandbox) if "pid" in op.params else ""
        real = {
            **t.b_tenant,
            "sandbox_id": sandbox,
            "host_id": "host-01",
            "template": "default",
            "hostname": "app.example.test",
            "pid": pid,
        }
        fake = {k: (same_shape(v) if k in TENANT_OWNED else v) for k, v in real.items()}
        for k in TENANT_OWNED:
            assert len(fake[k]) == len(real[k]) and fake[k] != real[k]
        stranger = await call(http, op, real, as_(t.a))
        made_up = await call(http, op, fake, as_(t.a))
        named = next(p for p in op.params if p in TENANT_OWNED)
        found = difference(stranger, made_up, real[named], fake[named])
        if found is not None:
            problems.append(f"{op.method} {op.path}:\n{found}")
        assert stranger.status_code < 500, (op, stranger.text)
        if named == "sandbox_id":
            # Not a vacuous equality: the id is real, and its owner's same call gets another answer.
            owner = await call(http, op, real, as_(t.b))
            assert (owner.status_code, owner.content) != (stranger.status_code, stranger.content), (
                op,
                owner.text,
            )
    return problems


async def test_corrals_api_answers_another_tenants_ids_as_made_up_ones(cluster: Cluster) -> None:
    t = await tenants(cluster)
    problems = []
    # With the hot layer in front (as served) and without it (the declared routes answer those too).
    for hot_routes in (True, False):
        app = create_app(cluster.plane, manage=False, hot_routes=hot_routes)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://corral.test") as http:
            problems += await _every_route(cluster, http, app, "bearer", t)
    assert not problems, "\n\n".join(problems)


async def test_e2bs_control_routes_answer_another_tenants_ids_as_made_up_ones(cluster: Cluster) -> None:
    t = await tenants(cluster)
    problems = await _every_route(cluster, cluster.http, e2b_app(), "X-API-KEY", t)
    assert not problems, "\n\n".join(problems)


# -- the data plane ---------------------------------------------------------------------------------

_USER = {"Authorization": "Basic " + base64.b64encode(b"user:").decode()}  # what the SDK sends


def _data_plane_request(route: Any, method: str) -> dict[str, Any]:
    if method == "GET":
        return {"params": {"path": "/etc/hostname"}}
    if route.path == "/files":
        return {"params": {"path": "/tmp/x"}, "files": {"file": ("x", b"payload")}}
    return {"content": b"{}", "headers": {"Content-Type": "application/json"}}


async def test_the_data_plane_answers_another_tenants_ids_as_made_up_ones(cluster: Cluster) -> None:
    c = cluster
    t = await tenants(c)
    own = await new_sandbox(c, t.a)
    own_token = (await c.http.get(f"/sandboxes/{own}", headers={"X-API-KEY": t.a})).json()["envdAccessToken"]
    victim = await new_sandbox(c, t.b)
    made_up = same_shape(victim)
    # What the SDK sends (the access token of a sandbox, the user), and what a hostile caller adds.
    credentials = [
        {"X-Access-Token": own_token, **_USER},
        {"X-API-KEY": t.a, **_USER},
        {"X-API-KEY": t.a, "X-Access-Token": own_token},
        {"X-Access-Token": "0" * 64},
        {},
    ]
    routes = Envd(c.fleet.agents[0]).app.routes
    problems, tried = [], 0
    for route in routes:
        for method in sorted(route.methods - {"HEAD"}):  # type: ignore[attr-defined]
            for creds in credentials:
                answers = []
                for sid in (victim, made_up):
                    kw = _data_plane_request(route, method)
                    headers = {SANDBOX_HEADER: sid, **creds, **kw.pop("headers", {})}
                    answers.append(await c.http.request(method, route.path, headers=headers, **kw))
                found = difference(answers[0], answers[1], victim, made_up)
                if found is not None:
                    problems.append(f"{method} {route.path} with {sorted(creds)}:\n{found}")
                assert answers[0].status_code == 502, (route.path, answers[0].text)  # what E2B answers
                tried += 1
    assert tried >= 14 * len(credentials)
    assert not problems, "\n\n".join(problems)
    # Not a vacuous equality: the victim's own key does reach the victim's sandbox.
    r = await c.http.post(
        "/process.Process/List", content=b"{}", headers={SANDBOX_HEADER: victim, "X-API-KEY": t.b, **_USER}
    )
    assert r.status_code == 200, r.text
