"""The SDK and the CLI over a real socket: the fake API served by uvicorn on an ephemeral loopback port."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import typer
import uvicorn
from typer.testing import CliRunner

from corral.client import AsyncCorral, CapacityUnavailable, Corral
from corral.client.burst import run_burst
from corral.client.cli import COMMANDS

from .fakes import FakeApi, FakeTime, refusal


def asgi(api: FakeApi) -> Any:
    """Serve ``FakeApi.handle`` as an ASGI app (the same handler the MockTransport tests use)."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        query = scope["query_string"].decode()
        request = httpx.Request(
            scope["method"],
            f"http://loopback{scope['path']}" + (f"?{query}" if query else ""),
            headers=[(k.decode(), v.decode()) for k, v in scope["headers"]],
            content=body,
        )
        response = api.handle(request)
        headers = [(k.encode(), v.encode()) for k, v in response.headers.items()]
        await send({"type": "http.response.start", "status": response.status_code, "headers": headers})
        await send({"type": "http.response.body", "body": response.content})

    return app


@pytest.fixture
def served() -> Iterator[tuple[FakeApi, str]]:
    api = FakeApi(hosts=("h1", "h2", "h3", "h4"))
    server = uvicorn.Server(
        uvicorn.Config(asgi(api), host="127.0.0.1", port=0, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            pytest.fail("uvicorn did not start")
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield api, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_sync_create_retry_exec_and_kill_over_http(served: tuple[FakeApi, str]) -> None:
    api, url = served
    api.create_script.append(refusal(503, "no_capacity", retry_after=2))
    fake = FakeTime()
    with Corral(url, "t0k", clock=fake.clock, sleep=fake.sleep, rng=random.Random(0)) as c:
        with c.sandboxes.create("python") as sandbox:
            assert sandbox.host_id == "h1"
            assert sandbox.exec(["echo", "hi"]).stdout == "echo hi\n"
        assert api.deleted == [sandbox.id]
        (delay,) = fake.sleeps
        assert 2.0 <= delay <= 2.25  # the Retry-After header crossed the wire
        api.create_script.extend(refusal(503, "no_healthy_hosts", retry_after=1) for _ in range(5))
        with pytest.raises(CapacityUnavailable) as info:
            c.sandboxes.create("python", deadline_s=2.0)
        assert info.value.needs_operator


async def test_async_burst_over_http(served: tuple[FakeApi, str]) -> None:
    api, url = served
    async with AsyncCorral(url, "t0k") as c:
        report = await run_burst(c, 40, template="python")
    assert report.summary.per_host == {"h1": 10, "h2": 10, "h3": 10, "h4": 10}
    assert report.deleted == 40 and api.sandboxes == {}


def test_cli_burst_json_over_http(served: tuple[FakeApi, str]) -> None:
    api, url = served
    app = typer.Typer()
    for name, command in COMMANDS.items():
        app.command(name)(command)
    result = CliRunner().invoke(app, ["burst", "-n", "8", "--url", url, "--token", "t0k", "--json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["per_host"] == {"h1": 2, "h2": 2, "h3": 2, "h4": 2}
    assert data["max_to_median"] == 1.0 and data["deleted"] == 8
    assert api.sandboxes == {} and len(api.deleted) == 8


def test_a_kept_alive_connection_is_given_up_before_the_server_closes_it() -> None:
    # Equal limits race: a request sent just as the server closes an idle connection finds it gone.
    from corral.client import AsyncCorral, Corral, wire
    from corral.core.listen import ListenBounds

    assert ListenBounds().keep_alive_s > wire.KEEPALIVE_EXPIRY_S
    for client in (Corral("http://127.0.0.1:1", "t"), AsyncCorral("http://127.0.0.1:1", "t")):
        pool = client._http._transport._pool  # type: ignore[union-attr]
        assert pool._keepalive_expiry == wire.KEEPALIVE_EXPIRY_S
