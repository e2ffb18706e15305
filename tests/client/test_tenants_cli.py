"""``client.tenants.delete`` on both clients and ``corral tenants rm``, against a recorded contract:
DELETE /v1/tenants/{name}, 204 when removed; a refusal raises its typed error in the SDK and, from the
command line, prints the server's code and message and exits non-zero."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from typer.testing import CliRunner

from corral.client import AsyncCorral, Corral, TenantBusy
from corral.client.cli import EXIT_REFUSED, ClientFactory
from corral.client.errors import Forbidden, NotFound
from corral.client.tenants_cli import tenants_app

ARGS = ["--url", "http://corral.test", "--token", "t0k"]
BUSY = "tenant 'busy' has 2 live sandboxes: delete them first, then remove the tenant"


def _error(status: int, code: str, message: str, **details: object) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "message": message, "details": details}})


def _server(seen: list[tuple[str, str]]) -> httpx.MockTransport:
    """acme is removed; busy still has live sandboxes; nope never existed; default is the admin's."""

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.raw_path.decode()))
        name = request.url.path.rpartition("/")[2]
        if request.method != "DELETE" or not request.url.path.startswith("/v1/tenants/"):
            return httpx.Response(405)
        if name == "acme":
            return httpx.Response(204)
        if name == "busy":
            return _error(409, "tenant_has_sandboxes", BUSY, live_sandboxes=2)
        if name == "default":
            return _error(
                403, "forbidden", "the 'default' tenant holds the admin tokens: it is never removed"
            )
        return _error(404, "not_found", f"no tenant {name!r}")

    return httpx.MockTransport(handle)


def test_the_blocking_client_deletes_a_tenant_and_raises_the_refusals() -> None:
    seen: list[tuple[str, str]] = []
    with Corral("http://corral.test", "t0k", transport=_server(seen)) as client:
        assert client.tenants.delete("acme") is None
        with pytest.raises(TenantBusy) as busy:
            client.tenants.delete("busy")
        assert (busy.value.code, busy.value.status, busy.value.details) == (
            "tenant_has_sandboxes",
            409,
            {"live_sandboxes": 2},
        )
        with pytest.raises(NotFound):
            client.tenants.delete("nope")
        with pytest.raises(Forbidden):
            client.tenants.delete("default")
    assert seen == [("DELETE", f"/v1/tenants/{n}") for n in ("acme", "busy", "nope", "default")]


def test_the_asyncio_client_deletes_a_tenant_and_raises_the_refusals() -> None:
    seen: list[tuple[str, str]] = []

    async def run() -> None:
        async with AsyncCorral("http://corral.test", "t0k", transport=_server(seen)) as client:
            assert await client.tenants.delete("acme") is None
            with pytest.raises(TenantBusy):
                await client.tenants.delete("busy")

    asyncio.run(run())
    assert seen == [("DELETE", "/v1/tenants/acme"), ("DELETE", "/v1/tenants/busy")]


def _rm(*args: str) -> tuple[int, str, str, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    factory = ClientFactory(transport=_server(seen), async_transport=_server(seen))
    result = CliRunner().invoke(tenants_app, ["rm", *args, *ARGS], obj=factory)
    return result.exit_code, result.stdout, result.stderr, seen


def test_rm_says_what_it_removed() -> None:
    code, out, _, seen = _rm("acme")
    assert code == 0 and out == "removed tenant acme; its tokens and E2B keys are revoked\n"
    assert seen == [("DELETE", "/v1/tenants/acme")]
    code, out, _, _ = _rm("acme", "--json")
    assert code == 0 and json.loads(out) == {"name": "acme", "removed": True}


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("busy", f"error: tenant_has_sandboxes: {BUSY}"),
        ("nope", "error: not_found: no tenant 'nope'"),
        ("default", "error: forbidden: the 'default' tenant holds the admin tokens"),
    ],
)
def test_rm_refused_prints_the_code_and_message_and_exits_nonzero(name: str, said: str) -> None:
    code, out, err, _ = _rm(name, "--json")
    assert code == EXIT_REFUSED and out == ""
    assert err.startswith(said), err
