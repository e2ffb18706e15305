"""The byte relay before the replica's parser (:mod:`corral.agent.portsplice`), on a real uvicorn
listener configured as the API's is, with a routing plan of the test's own (every request whose
Host starts ``port.`` goes to an upstream server on loopback) and an ASGI app that answers the rest.
Raw sockets play the callers, an asyncio server the sandbox's: kept-alive requests, chunked bodies
both ways, pipelining, a large body under flow control, an upstream that closes before or during its
answer, and heads that two parsers could read two ways (those never reach the upstream)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import uvicorn
from starlette.types import Receive, Scope, Send

from corral.agent.portsplice import PortSplicer, Splice, UpstreamPool
from corral.aio import loop_factory
from corral.api.app import create_app
from corral.api.ports import Ports
from corral.codes import ErrorCode
from corral.core.httphead import RequestHead, parse_request, render_request
from corral.core.listen import ListenBounds
from corral.listener import uvicorn_config
from tests.security.test_slow_clients import closed_by_server, serving

from .conftest import ADMIN, make_cluster

DEADLINE_S = 15.0  # how long anything may take on a loaded machine: a deadline, not a measure
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def app(scope: Scope, receive: Receive, send: Send) -> None:
    """The rest of the API: says it answered, and which path."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    body = b"asgi " + scope["path"].encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


class Harness:
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.planned: list[RequestHead] = []
        self.released = 0
        self.refuse = False
        self.server: uvicorn.Server | None = None
        self.held: asyncio.Event | None = None  # set: plans wait for it
        self.holding = asyncio.Event()
        self.pool: UpstreamPool | None = None

    async def plan(self, head: RequestHead) -> Splice | None:
        if self.held is not None:
            self.holding.set()
            await self.held.wait()
        if not (head.header(b"host") or b"").startswith(b"port.") or self.refuse:
            return None
        self.planned.append(head)
        relayed = (*((k, v) for k, v in head.headers if k != b"x-secret"), (b"x-hop", b"1"))

        def release() -> None:
            self.released += 1

        return Splice(
            "127.0.0.1", self.upstream_port, render_request(head.method, head.target, relayed), release
        )


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
    """One request off the upstream's connection: its line, headers, and body (de-chunked)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    lines = head[:-4].split(b"\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    body = b""
    if headers.get(b"transfer-encoding") == b"chunked":
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    elif b"content-length" in headers:
        body = await reader.readexactly(int(headers[b"content-length"]))
    return lines[0], headers, body


async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """The sandbox's server: answers each request with what it got (line, x-hop, x-secret, body
    length), kept alive."""
    while (got := await read_request(reader)) is not None:
        line, headers, body = got
        if line.startswith(b"GET /close-early"):
            writer.close()
            return
        if line.startswith(b"GET /cut"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
            await writer.drain()
            writer.close()
            return
        if line.startswith(b"GET /chunked"):
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: keep-alive\r\n\r\n")
            writer.write(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
            continue
        if line.startswith(b"GET /big"):
            n = 20_000_000
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % n)
            block = b"x" * 65536
            for start in range(0, n, len(block)):
                writer.write(block[: min(len(block), n - start)])
                await writer.drain()
            continue
        text = b"%s hop=%s secret=%s len=%d" % (
            line,
            headers.get(b"x-hop", b"-"),
            headers.get(b"x-secret", b"-"),
            len(body),
        )
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text))
        await writer.drain()
    writer.close()


@contextlib.asynccontextmanager
async def served(
    handler: Handler = echo,
    bounds: ListenBounds = ListenBounds(),
    implementation: str | None = None,
    idle_s: float = 30.0,
) -> AsyncIterator[tuple[int, Harness]]:
    upstream = await asyncio.start_server(handler, "127.0.0.1", 0)
    harness = Harness(upstream.sockets[0].getsockname()[1])
    front = PortSplicer(harness.plan, idle_s)
    harness.pool = front.pool
    config = uvicorn_config(
        app,
        "127.0.0.1",
        0,
        bounds,
        implementation=implementation,
        front=front,
        log_level="warning",
        lifespan="off",
    )
    server = uvicorn.Server(config)
    harness.server = server
    try:
        async with serving(server) as port:
            yield port, harness
    finally:
        front.pool.close()
        upstream.close()


async def response(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
    lines = head[:-4].split(b"\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(b":") for line in lines[1:])}
    if headers.get(b"transfer-encoding") == b"chunked":
        body = b""
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    else:
        body = await asyncio.wait_for(
            reader.readexactly(int(headers.get(b"content-length", b"0"))), DEADLINE_S
        )
    return int(lines[0].split(b" ")[1]), headers, body


async def test_kept_alive_requests_are_spliced_and_the_rest_is_the_apps() -> None:
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        for n in range(3):
            writer.write(
                b"GET /a/%d?q=1 HTTP/1.1\r\nHost: port.x\r\nX-Secret: s\r\nConnection: keep-alive\r\n\r\n" % n
            )
            status, headers, body = await response(reader)
            assert (status, body) == (200, b"GET /a/%d?q=1 HTTP/1.1 hop=1 secret=- len=0" % n)
            assert b"connection" not in headers
        # A body by length and one in chunks, the chunks passed on as they came.
        writer.write(b"POST /p HTTP/1.1\r\nHost: port.x\r\nContent-Length: 5\r\n\r\nhello")
        assert (await response(reader))[2].endswith(b"len=5")
        writer.write(
            b"POST /p HTTP/1.1\r\nHost: port.x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        )
        assert (await response(reader))[2].endswith(b"len=3")
        writer.write(b"GET /chunked HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[2] == b"hello world"
        # Not a port request: the app's, and the connection stays the app's.
        writer.write(b"GET /api HTTP/1.1\r\nHost: api.x\r\n\r\nGET /again HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[2] == b"asgi /api"
        assert (await response(reader))[2] == b"asgi /again"
        writer.close()
        assert len(harness.planned) == 6 and harness.released == 6


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"".join(b"GET /%d HTTP/1.1\r\nHost: port.x\r\n\r\n" % n for n in range(5)))
        for n in range(5):
            assert (await response(reader))[2].startswith(b"GET /%d " % n)
        writer.close()
        assert harness.released == 5


async def test_a_large_answer_streams_whole() -> None:
    async with served() as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /big HTTP/1.1\r\nHost: port.x\r\n\r\n")
        status, _, body = await response(reader)
        assert status == 200 and len(body) == 20_000_000 and body == b"x" * 20_000_000
        writer.write(b"GET /after HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[2].startswith(b"GET /after ")
        writer.close()


async def test_an_upstream_that_closes_without_answering_is_port_closed() -> None:
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /close-early HTTP/1.1\r\nHost: port.x\r\n\r\n")
        status, _, body = await response(reader)
        assert status == 502 and b'"port_closed"' in body
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        assert harness.released == 1


async def test_an_answer_cut_off_closes_the_callers_connection() -> None:
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /cut HTTP/1.1\r\nHost: port.x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), DEADLINE_S)
        assert b"content-length: 100" in head
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b"partial"  # then the close
        assert harness.released == 1


@pytest.mark.parametrize(
    "head",
    [
        # Framed two ways: the smuggling classics.
        b"POST /s HTTP/1.1\r\nHost: port.x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"POST /s HTTP/1.1\r\nHost: port.x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcd",
        b"POST /s HTTP/1.1\r\nHost: port.x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"POST /s HTTP/1.1\r\nHost: port.x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
        b"POST /s HTTP/1.1\r\nHost: port.x\r\nContent-Length: +4\r\n\r\nabcd",
        # A folded line, two Hosts, an absolute target, HTTP/1.0, an upgrade, an expectation.
        b"GET /s HTTP/1.1\r\nHost: port.x\r\nX-A: 1\r\n folded\r\n\r\n",
        b"GET /s HTTP/1.1\r\nHost: port.x\r\nHost: api.x\r\n\r\n",
        b"GET http://port.x/s HTTP/1.1\r\nHost: port.x\r\n\r\n",
        b"GET /s HTTP/1.0\r\nHost: port.x\r\n\r\n",
        b"GET /s HTTP/1.1\r\nHost: port.x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        b"POST /s HTTP/1.1\r\nHost: port.x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
        # A second Host behind a bare LF, a NUL, a line that is a field to one parser and not another.
        b"GET /s HTTP/1.1\r\nHost: port.x\r\nX-A: 1\nHost: api.x\r\n\r\n",
        b"GET /s HTTP/1.1\r\nHost: port.x\r\nX-A: \x00\r\n\r\n",
        b"GET /s HTTP/1.1\r\nHost: port.x\r\nX-A\x00: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ],
)
async def test_a_head_two_parsers_could_read_two_ways_never_reaches_the_upstream(head: bytes) -> None:
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head)
        got = await asyncio.wait_for(reader.read(65536), DEADLINE_S)
        assert b"hop=" not in got  # uvicorn's: the app's answer, or its refusal
        assert harness.planned == []
        writer.close()


async def test_a_refused_request_is_the_apps_to_answer() -> None:
    async with served() as (port, harness):
        harness.refuse = True
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[2] == b"asgi /x"
        writer.close()


async def test_a_bad_chunk_from_the_caller_closes_both_sides() -> None:
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /p HTTP/1.1\r\nHost: port.x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n")
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        assert harness.released == 1


def test_the_same_under_the_servers_own_loop() -> None:
    """uvloop, where the servers run on it (its transports are not asyncio's classes)."""
    factory = loop_factory()
    assert factory is not None, "uvloop comes with uvicorn[standard], the server extra's dependency"
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(test_kept_alive_requests_are_spliced_and_the_rest_is_the_apps())
        runner.run(test_a_large_answer_streams_whole())


async def test_handed_over_to_either_parser() -> None:
    async with served(implementation="h11") as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /p HTTP/1.1\r\nHost: port.x\r\n\r\nGET /api HTTP/1.1\r\nHost: api.x\r\n\r\n")
        assert (await response(reader))[2].startswith(b"GET /p ")
        assert (await response(reader))[2] == b"asgi /api"
        writer.close()


async def slow_reader(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A sandbox's server that takes its time before it reads a request's body."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await asyncio.sleep(2.5)
    body = await reader.readexactly(length)
    text = b"got %d" % len(body)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text))
    await writer.drain()
    writer.close()


async def test_an_upstream_slow_to_read_is_not_a_stalled_caller() -> None:
    """The caller is not read while the upstream holds back: the body deadline (1 s here) sees the
    server's own pause, not a caller's stall, and the whole body goes through."""
    bounds = ListenBounds(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1)
    async with served(slow_reader, bounds) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        n = 8_000_000
        writer.write(b"POST /slow HTTP/1.1\r\nHost: port.x\r\nContent-Length: %d\r\n\r\n" % n)
        writer.write(b"y" * n)
        await writer.drain()
        assert (await response(reader))[2] == b"got %d" % n
        writer.close()


async def test_a_caller_that_stalls_mid_body_or_idles_is_closed() -> None:
    bounds = ListenBounds(header_timeout_s=1.0, body_timeout_s=1.0, keep_alive_s=1)
    async with served(bounds=bounds) as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /p HTTP/1.1\r\nHost: port.x\r\nContent-Length: 10\r\n\r\nabc")
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""
        assert harness.released == 1
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /p HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[0] == 200
        assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b""  # idle past keep-alive


async def test_what_the_replica_refuses_is_the_asgi_paths_and_holds_nothing(tmp_path: Path) -> None:
    """A replica's plan (``Ports.splice_plan``) takes no request it would refuse, and keeps no
    per-sandbox slot for one: the ASGI path answers it, with its code."""
    cluster = await make_cluster(tmp_path, hosts=1, memory_mb=8192)
    try:
        app = create_app(cluster.plane, manage=False)
        assert isinstance(app.ports, Ports)
        ports = app.ports
        made = await cluster.http.post("/v1/sandboxes", json={}, headers=cluster.as_(ADMIN))
        sid = made.json()["id"]  # a sim sandbox: no interface, so its ports are unreachable
        cases = {
            f"/v1/sandboxes/{sid}/ports/8080/x": (409, ErrorCode.NETWORK_NOT_ATTACHED),
            "/v1/sandboxes/sb-00000000000000000000dead/ports/8080/x": (404, ErrorCode.NOT_FOUND),
            f"/v1/sandboxes/{sid}/ports/65536/x": (422, ErrorCode.INVALID_REQUEST),
        }
        for path, (status, code) in cases.items():
            head = parse_request(b"GET %s HTTP/1.1\r\nHost: corral.test\r\n\r\n" % path.encode())
            assert await ports.splice_plan(head) is None
            r = await cluster.http.get(path)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code)
        for extra in (b"Corral-Forwarded: 1\r\n", b"Authorization: Bearer x\r\n", b"X-Api-Key: k\r\n"):
            path = f"/v1/sandboxes/{sid}/ports/8080/x".encode()
            head = parse_request(b"GET %s HTTP/1.1\r\nHost: corral.test\r\n%s\r\n" % (path, extra))
            assert await ports.splice_plan(head) is None
        api = parse_request(b"GET /v1/sandboxes HTTP/1.1\r\nHost: corral.test\r\n\r\n")
        assert await ports.splice_plan(api) is None
        assert ports.in_flight.total == 0
    finally:
        await cluster.close()


async def test_an_idle_upstream_connection_is_closed_in_time() -> None:
    """A sandbox that is gone never closes its end: the relay closes its idle ones itself."""
    closed = asyncio.Event()

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await echo(reader, writer)
        closed.set()

    async with served(once, idle_s=0.2) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[0] == 200
        await asyncio.wait_for(closed.wait(), DEADLINE_S)
        writer.close()


async def test_an_answer_begun_while_the_caller_is_not_reading_waits_for_it() -> None:
    """A caller whose buffer is full when its next request is taken (a pipelined one, after an
    answer that ended in the chunk that filled it) gets no more of the next answer until it reads:
    the new upstream is not read either, so a caller that never reads cannot make the replica hold
    a sandbox's endless answer in memory."""
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /a HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[0] == 200
        assert harness.server is not None
        (protocol,) = harness.server.server_state.connections
        # The caller's transport says its buffer is full, and says so once (as it does: not again
        # before it has said the buffer drained).
        protocol.transport.set_write_buffer_limits(high=2**40)
        protocol.pause_writing()
        writer.write(b"GET /big HTTP/1.1\r\nHost: port.x\r\n\r\n")
        fronted = protocol.fronted
        while fronted.upstream is None:
            await asyncio.sleep(0.01)
        assert not fronted.upstream.transport.is_reading()
        protocol.resume_writing()
        status, _, body = await response(reader)
        assert status == 200 and len(body) == 20_000_000
        writer.close()


async def test_a_request_hidden_in_a_body_is_the_upstreams_bytes_never_the_apps() -> None:
    """A spliced body that reads as an API request (with a credential) goes to the sandbox as the
    body it is; the connection's next request is read after it, wherever it goes."""
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        hidden = b"GET /hidden HTTP/1.1\r\nHost: api.x\r\nAuthorization: Bearer k\r\n\r\n"
        chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(hidden), hidden)
        writer.write(
            b"POST /p HTTP/1.1\r\nHost: port.x\r\nContent-Length: %d\r\n\r\n%s" % (len(hidden), hidden)
            + b"POST /p HTTP/1.1\r\nHost: port.x\r\nTransfer-Encoding: chunked\r\n\r\n"
            + chunked
            + b"GET /next HTTP/1.1\r\nHost: api.x\r\n\r\n"
        )
        assert (await response(reader))[2].endswith(b"len=%d" % len(hidden))
        assert (await response(reader))[2].endswith(b"len=%d" % len(hidden))
        assert (await response(reader))[2] == b"asgi /next"
        writer.close()
        assert len(harness.planned) == 2 and harness.released == 2


async def test_a_caller_gone_mid_answer_leaves_no_slot_and_no_upstream() -> None:
    """A caller that goes while its answer streams: its slot is given back and the upstream
    connection, mid-answer and so never to be reused, is closed."""
    upstream_closed = asyncio.Event()

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        with contextlib.suppress(ConnectionError):
            while not reader.at_eof():
                writer.write(b"10000\r\n" + b"z" * 65536 + b"\r\n")
                await writer.drain()
        upstream_closed.set()

    async with served(endless) as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /endless HTTP/1.1\r\nHost: port.x\r\n\r\n")
        await asyncio.wait_for(reader.readexactly(1_000_000), DEADLINE_S)
        writer.close()
        await asyncio.wait_for(upstream_closed.wait(), DEADLINE_S)
        assert harness.released == 1


@pytest.mark.parametrize("implementation", ["httptools", "h11"])
async def test_a_request_handed_over_while_the_server_stops_closes_its_connection(
    implementation: str,
) -> None:
    """The server stops while a request's route is being found, and the request is the app's after
    all: the app's parser is told of the stop too, so the connection ends with that answer and a
    caller cannot keep a stopping server open with more requests."""
    async with served(implementation=implementation) as (port, harness):
        harness.refuse, harness.held = True, asyncio.Event()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /x HTTP/1.1\r\nHost: port.x\r\n\r\n")
        await asyncio.wait_for(harness.holding.wait(), DEADLINE_S)
        assert harness.server is not None
        (protocol,) = harness.server.server_state.connections
        harness.server.should_exit = True
        while not protocol.fronted.stopping:
            await asyncio.sleep(0.01)
        harness.held.set()
        assert (await response(reader))[2] == b"asgi /x"
        with contextlib.suppress(ConnectionError):
            writer.write(b"GET /y HTTP/1.1\r\nHost: api.x\r\n\r\n")
        assert await closed_by_server(reader)


async def test_the_upstream_pool_keeps_nothing_for_an_address_it_holds_no_connection_to() -> None:
    """A caller can name many ports (and sandboxes come and go at many addresses): once an
    address's kept-alive connection is taken and not given back, nothing of it is kept."""
    async with served() as (port, harness):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /kept HTTP/1.1\r\nHost: port.x\r\n\r\n")
        assert (await response(reader))[0] == 200
        assert harness.pool is not None and len(harness.pool.idle) == 1
        writer.write(b"GET /cut HTTP/1.1\r\nHost: port.x\r\n\r\n")  # takes it; it never comes back
        while harness.released < 2:
            await asyncio.sleep(0.01)
        assert harness.pool.idle == {}
