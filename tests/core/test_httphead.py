"""HTTP/1.1 heads and framing for the byte relay: what it takes, what it leaves to the full server,
and where bodies end however their bytes are cut."""

from __future__ import annotations

import pytest

from corral.core.httphead import (
    MAX_HEAD,
    BadFraming,
    Body,
    Framing,
    Unrelayable,
    head_end,
    parse_request,
    parse_response,
    render_request,
    render_response,
)


def test_a_plain_request_is_taken_with_its_framing() -> None:
    head = parse_request(b"POST /a?b=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 12\r\nX-A:  v \r\n\r\n")
    assert (head.method, head.target, head.framing, head.length, head.keep_alive) == (
        b"POST",
        b"/a?b=1",
        Framing.LENGTH,
        12,
        True,
    )
    assert head.header(b"x-a") == b"v"
    chunked = parse_request(
        b"PUT / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: Chunked\r\nConnection: close\r\n\r\n"
    )
    assert (chunked.framing, chunked.keep_alive) == (Framing.CHUNKED, False)
    assert parse_request(b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n").framing is Framing.NONE


@pytest.mark.parametrize(
    "head",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 0x1\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1" + b"0" * 18 + b"\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: identity\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nX\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\tfolded\r\n\r\n",
        b"GET / HTTP/1.1\r\n\r\n",
        b"GET  / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /\x7f HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
        b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n",
    ],
)
def test_what_could_be_read_two_ways_is_not_taken(head: bytes) -> None:
    with pytest.raises(Unrelayable):
        parse_request(head)


def test_a_head_ends_at_its_blank_line_and_has_a_bound() -> None:
    assert head_end(b"GET / HTTP/1.1\r\nHost: x\r\n") is None
    assert head_end(b"GET / HTTP/1.1\r\n\r\nbody") == 18
    assert head_end(b"x" * MAX_HEAD) is None
    with pytest.raises(Unrelayable):
        head_end(b"x" * (MAX_HEAD + 1))


def test_an_answers_framing() -> None:
    def framing(head: bytes, method: bytes = b"GET") -> tuple[Framing, int, bool]:
        got = parse_response(head, method)
        return got.framing, got.length, got.keep_alive

    assert framing(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n") == (Framing.LENGTH, 5, True)
    assert framing(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", b"HEAD") == (Framing.NONE, 0, True)
    assert framing(b"HTTP/1.1 204 No Content\r\n\r\n") == (Framing.NONE, 0, True)
    assert framing(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n") == (Framing.NONE, 0, True)
    assert framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == (
        Framing.CHUNKED,
        0,
        True,
    )
    assert framing(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n") == (Framing.CLOSE, 0, False)
    assert framing(b"HTTP/1.1 200 OK\r\n\r\n") == (Framing.CLOSE, 0, False)
    assert framing(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n") == (Framing.LENGTH, 1, False)
    assert framing(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n")[2] is False
    for bad in (b"HTTP/1.1 2000 OK\r\n\r\n", b"ICY 200 OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nA B: c\r\n\r\n"):
        with pytest.raises(BadFraming):
            parse_response(bad, b"GET")


def test_heads_are_rewritten_without_what_concerns_one_hop() -> None:
    head = parse_response(
        b"HTTP/1.1 200 OK\r\nConnection: keep-alive, X-Private\r\nKeep-Alive: timeout=5\r\n"
        b"X-Private: 1\r\nTransfer-Encoding: chunked\r\nContent-Length: 9\r\nX-Kept: 2\r\n\r\n",
        b"GET",
    )
    assert render_response(head, closing=False) == (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nx-kept: 2\r\n\r\n"
    )
    assert render_response(head, closing=True).endswith(b"x-kept: 2\r\nconnection: close\r\n\r\n")
    for sized in (
        b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
    ):
        assert render_response(parse_response(sized, b"GET"), closing=False) == sized
    head_only = b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\n"  # the size of what a GET would get
    assert render_response(parse_response(head_only, b"HEAD"), closing=False) == head_only
    assert render_request(b"GET", b"/p", ((b"host", b"h"),)) == b"GET /p HTTP/1.1\r\nhost: h\r\n\r\n"


def _fed(body: Body, data: bytes, cut: int) -> int:
    took = body.feed(data[:cut])
    if took == cut and not body.done:
        took += body.feed(data[cut:])
    return took


CHUNKED = b"5;ext=1\r\nhello\r\n10\r\n" + b"z" * 16 + b"\r\n0\r\nTrailer: t\r\n\r\n"


@pytest.mark.parametrize("cut", range(len(CHUNKED) + 1))
def test_a_chunked_bodys_end_is_found_wherever_its_bytes_are_cut(cut: int) -> None:
    body = Body(Framing.CHUNKED)
    assert _fed(body, CHUNKED + b"NEXT", cut) == len(CHUNKED) and body.done


def test_a_length_ends_where_it_says_and_nothing_is_nothing() -> None:
    body = Body(Framing.LENGTH, 5)
    assert body.feed(b"abc") == 3 and not body.done
    assert body.feed(b"deNEXT") == 2 and body.done
    assert body.feed(b"more") == 0
    assert Body(Framing.NONE).feed(b"NEXT") == 0
    close = Body(Framing.CLOSE)
    assert close.feed(b"all of it") == 9 and not close.done


@pytest.mark.parametrize(
    "data",
    [b"zz\r\n", b"5\r\nhelloX\r\n", b"5\nhello\r\n", b"1" * 2000, b"-1\r\n", b"0\r\n" + b"t" * 20_000],
)
def test_a_broken_chunked_body_is_bad_framing(data: bytes) -> None:
    with pytest.raises(BadFraming):
        Body(Framing.CHUNKED).feed(data)
