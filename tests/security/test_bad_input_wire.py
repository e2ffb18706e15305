"""A 10 MB body is refused with a 413 without being read: against a real ``corral api`` over a raw
socket, so what the server reads (and when it answers) is observable."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest

from tests.e2e.procs import Proc, api_args, free_port, start, wait_ready

pytestmark = pytest.mark.slow

ADMIN = "wire-admin-token-0123456789"
TEN_MB = 10 * 1024 * 1024


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    logdir = tmp_path_factory.mktemp("wire")
    port = free_port()
    proc = start(
        "api", api_args(f"sqlite:///{logdir / 'corral.db'}", port, "wire"), logdir, {"CORRAL_TOKEN": ADMIN}
    )
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        yield proc
    finally:
        proc.stop()


def _request(url: str, head: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(head.encode())
    return s


def _answer(s: socket.socket) -> tuple[int, dict[str, object]]:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_a_declared_10_mb_body_is_refused_before_a_byte_of_it_is_sent(api: Proc) -> None:
    s = _request(
        api.url,
        "POST /v1/sandboxes HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {ADMIN}\r\nContent-Length: {TEN_MB}\r\n\r\n",
    )
    with s:
        # Nothing of the body was sent, yet the answer comes: the server never waited to read it.
        status, body = _answer(s)
    assert status == 413 and body["error"]["code"] == "payload_too_large"  # type: ignore[index]


def test_a_chunked_10_mb_body_is_cut_off_at_the_cap(api: Proc) -> None:
    s = _request(
        api.url,
        "POST /v1/sandboxes/sb-x/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {ADMIN}\r\nTransfer-Encoding: chunked\r\n\r\n",
    )
    chunk = b"x" * 65536
    sent = 0
    with s:
        # Send a little over the 1 MiB cap, then stop: the answer arrives with 8 MiB never sent.
        while sent < 1024 * 1024 + 2 * len(chunk):
            s.sendall(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            sent += len(chunk)
        status, body = _answer(s)
    assert sent < TEN_MB
    assert status == 413 and body["error"]["code"] == "payload_too_large"  # type: ignore[index]
