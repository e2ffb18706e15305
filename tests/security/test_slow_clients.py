"""Slow and greedy clients against real listeners: the API and the host agent, each served by uvicorn
on a loopback port through the configuration their commands use (``api_server``, ``agent_server``),
with the timeouts set short. Raw sockets play the attackers: a slowloris dripping header lines, a
body that stalls, an idle kept-alive connection, more connections than the cap, and one token with
more requests in flight than its bound."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import httpx
import pytest
import uvicorn

from corral.agent.agent import Agent
from corral.agent.cli import agent_server
from corral.agent.config import AgentConfig
from corral.api.app import create_app
from corral.api.server import api_server
from corral.core.listen import ListenBounds
from corral.listener import IMPLEMENTATIONS
from corral.runtime.sim import SimRuntime

from .conftest import ADMIN, Cluster

SHORT = ListenBounds(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1)
DEADLINE_S = 15.0  # how long any close may take, on a loaded machine: a deadline, not a measure
HOST_KEY = "host-key-for-slow-client-tests"


@contextlib.asynccontextmanager
async def serving(server: uvicorn.Server) -> AsyncIterator[int]:
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            await task
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, DEADLINE_S)


def api(
    cluster: Cluster, bounds: ListenBounds = SHORT, per_token: int = 256, http: str | None = None
) -> contextlib.AbstractAsyncContextManager[int]:
    server = api_server(create_app(cluster.plane, manage=False), "127.0.0.1", 0, bounds, per_token)
    if http is not None:  # the other implementation than uvicorn's "auto" would choose
        from corral.listener import protocol_class

        server.config.http = protocol_class(bounds, http)
    return serving(server)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closes the connection (EOF or a reset), False if it sends anything."""
    try:
        data = await asyncio.wait_for(reader.read(65536), DEADLINE_S)
    except (ConnectionResetError, BrokenPipeError):
        return True
    return data == b""


async def drip(writer: asyncio.StreamWriter, every_s: float = 0.5) -> int:
    """A slowloris: a request line, then a header line every ``every_s``, never the blank line. Returns
    the lines it got in before the connection went."""
    lines = 0
    with contextlib.suppress(ConnectionError, OSError):
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        await writer.drain()
        while not writer.is_closing():
            await asyncio.sleep(every_s)
            writer.write(f"X-Slow-{lines}: {'a' * 8}\r\n".encode())
            await writer.drain()
            lines += 1
    return lines


async def slowloris(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    dripping = asyncio.create_task(drip(writer))
    try:
        return await closed_by_server(reader)
    finally:
        dripping.cancel()
        writer.close()


async def get(port: int, path: str = "/healthz", token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=DEADLINE_S) as client:
        return await client.get(path, headers=headers)


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
async def test_a_slowloris_is_closed_at_the_header_timeout_and_others_are_served(
    cluster: Cluster, http: str
) -> None:
    async with api(cluster, http=http) as port:
        slow = asyncio.create_task(slowloris(port))
        assert (await get(port)).status_code == 200  # served while the slow one drips
        assert await slow


async def test_two_hundred_slowloris_connections_are_all_closed(cluster: Cluster) -> None:
    async with api(cluster) as port:
        results = await asyncio.gather(*(slowloris(port) for _ in range(200)))
        assert results.count(True) == 200
        assert (await get(port)).status_code == 200


async def test_a_connection_that_sends_nothing_is_closed(cluster: Cluster) -> None:
    async with api(cluster) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await closed_by_server(reader)
        finally:
            writer.close()


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
async def test_a_stalled_body_is_closed(cluster: Cluster, http: str) -> None:
    async with api(cluster, http=http) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + ADMIN.encode() + b'\r\nContent-Length: 100\r\n\r\n{"templ'
            )
            await writer.drain()
            assert await closed_by_server(reader)
        finally:
            writer.close()
        assert (await cluster.plane.store.list_sandboxes()).items == []  # nothing was created of it


@pytest.mark.parametrize("http", IMPLEMENTATIONS)
async def test_an_idle_kept_alive_connection_is_closed(cluster: Cluster, http: str) -> None:
    async with api(cluster, http=http) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
            assert head.startswith(b"HTTP/1.1 200")
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            assert await closed_by_server(reader)  # kept alive, then idle: closed
        finally:
            writer.close()


async def test_connections_over_the_cap_are_closed_on_accept(cluster: Cluster) -> None:
    bounds = replace(SHORT, header_timeout_s=30.0, max_connections=5)
    async with api(cluster, bounds) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(5)]
        extra = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
        try:
            assert [await closed_by_server(r) for r, _ in extra] == [True] * 3
            for reader, writer in held:  # the first five were kept, and are served
                writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                await writer.drain()
                answer = await asyncio.wait_for(reader.read(), DEADLINE_S)
                assert answer.startswith(b"HTTP/1.1 200"), answer
        finally:
            for _, writer in held + extra:
                writer.close()
        assert (await get(port)).status_code == 200  # their places were given back


async def test_connections_over_the_cap_per_peer_are_closed_on_accept(cluster: Cluster) -> None:
    bounds = replace(SHORT, header_timeout_s=30.0, max_connections_per_peer=2)
    async with api(cluster, bounds) as port:
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert await closed_by_server(reader)
        finally:
            writer.close()
            for _, w in held:
                w.close()


@contextlib.contextmanager
def _closing(writers: list[asyncio.StreamWriter]) -> Iterator[None]:
    try:
        yield
    finally:
        for w in writers:
            w.close()


async def test_one_token_over_its_bound_of_requests_in_flight_gets_429(cluster: Cluster) -> None:
    r = await cluster.http.post("/v1/tenants", json={"name": "other"}, headers=cluster.as_(ADMIN))
    other = r.json()["token"]
    bounds = replace(SHORT, body_timeout_s=60.0)
    async with api(cluster, bounds, per_token=3) as port:
        stalled = []
        for _ in range(3):  # three creates in flight, each waiting for the rest of its body
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(
                b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Authorization: Bearer " + ADMIN.encode() + b"\r\nContent-Length: 100\r\n\r\n{"
            )
            await writer.drain()
            stalled.append(writer)
        with _closing(stalled):
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while (refused := await get(port, "/v1/sandboxes", ADMIN)).status_code != 429:
                assert loop.time() < deadline, "a fourth request of one token was never refused"
                await asyncio.sleep(0.05)
            err = refused.json()["error"]
            assert err["code"] == "too_many_connections"
            assert err["retry_after_s"] >= 1 and int(refused.headers["Retry-After"]) >= 1
            assert err["details"] == {"max_in_flight": 3}
            assert (await get(port, "/v1/sandboxes", other)).status_code == 200  # another token: served
        # Once the stalled ones are gone, the token is served again.
        deadline = loop.time() + DEADLINE_S
        while (await get(port, "/v1/sandboxes", ADMIN)).status_code != 200:
            assert loop.time() < deadline, "the token's bound was never given back"
            await asyncio.sleep(0.05)


async def test_the_agent_closes_a_slowloris_and_serves_others() -> None:
    agent = Agent(AgentConfig("host-slow", 16_384, 8.0), SimRuntime())
    server = agent_server(agent, HOST_KEY, "127.0.0.1", 0, SHORT)
    async with serving(server) as port:
        slow = asyncio.create_task(slowloris(port))
        assert (await get(port, "/v1/capacity", HOST_KEY)).status_code == 200
        assert await slow
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n{")
            await writer.drain()
            # Refused for want of a key before its body is read, then the stalled body is closed.
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
            assert answer.startswith(b"HTTP/1.1 401")
        finally:
            writer.close()
