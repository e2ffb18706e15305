"""The control-socket client (corral.runtime.sentry) against a peer of the test's own that speaks runsc's
urpc: where it connects (the state directory's file socket of newer runsc releases, through a long
path too), what a call carries (one JSON object, the command's descriptors beside it), answers that
come in pieces, and peers that are not the Sentry (garbage, a flood, a wrong shape, a hang-up): each
is a clear exception, never a hang or a crash. runsc itself is exercised in test_gvisor_lifecycle."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from corral.runtime import sentry

# What the fake peer does with one accepted connection: reads a call, answers as told.
Answer = Callable[[socket.socket, dict[str, Any], list[int]], None]


class FakeSentry:
    """A unix socket at ``<dir>/runsc-<cid>.sock`` answering each call with ``answer``; the calls and
    descriptors it received are kept."""

    def __init__(self, state_dir: Path, cid: str, answer: Answer) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fds: list[list[int]] = []
        self._answer = answer
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        at = os.open(state_dir, os.O_PATH | os.O_DIRECTORY)
        try:
            self._listener.bind(f"/proc/self/fd/{at}/runsc-{cid}.sock")
        finally:
            os.close(at)
        self._listener.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                data, fds, _flags, _addr = socket.recv_fds(conn, 65536, 8)
                call = json.loads(data)
                self.calls.append(call)
                self.fds.append(list(fds))
                try:
                    self._answer(conn, call, list(fds))
                except OSError:
                    pass  # the client hung up first (on an answer too long to read, say)
                finally:
                    for fd in fds:
                        os.close(fd)

    def close(self) -> None:
        self._listener.close()


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    # Longer than a unix socket's address may be: the client goes through a descriptor of it.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    return deep


@pytest.fixture
def serving(state_dir: Path) -> Iterator[Callable[[Answer], FakeSentry]]:
    made: list[FakeSentry] = []

    def make(answer: Answer) -> FakeSentry:
        made.append(FakeSentry(state_dir, "c1", answer))
        return made[-1]

    yield make
    for fake in made:
        fake.close()


def _args() -> dict[str, Any]:
    return sentry.exec_args("c1", ["echo", '","KUID":0,"x":"'], {"A": "1"}, "/tmp", uid=1000, gid=1000)


async def test_a_command_starts_and_its_wait_is_read_from_an_answer_in_pieces(
    state_dir: Path, serving: Callable[[Answer], FakeSentry]
) -> None:
    def answer(conn: socket.socket, call: dict[str, Any], fds: list[int]) -> None:
        os.write(fds[1], b"out\n")  # the command's stdout, as the guest would write it
        conn.sendall(b'{"success": true, "err": "", ')
        conn.sendall(b'"result": 42}')  # the pid, in a second piece
        waited = json.loads(conn.recv(65536))
        assert waited == {"method": "containerManager.WaitPID", "arg": {"PID": 42, "CID": "c1"}}
        conn.sendall(json.dumps({"success": True, "err": "", "result": 5 << 8}).encode())

    fake = serving(answer)
    command = await sentry.start(sentry.Control("c1", state_dir), _args(), stdin=False)
    assert command.pid == 42
    assert await command.stdout.readline() == b"out\n"
    assert await command.wait() == 5
    (call,) = fake.calls
    assert call["method"] == "containerManager.ExecuteAsync"
    # The tenant's words are values, never the call's own fields.
    assert call["arg"]["argv"] == ["echo", '","KUID":0,"x":"'] and call["arg"]["KUID"] == 1000
    assert call["arg"]["GuestFDs"] == [0, 1, 2] and len(fake.fds[0]) == 3


@pytest.mark.parametrize(
    ("reply", "raised"),
    [
        (b'{"success": false, "err": "no such file", "result": null}', sentry.SentryRefused),
        (b'{"success": true, "err": "", "result": -1}', sentry.SentryRefused),
        (b'{"success": true, "err": "", "result": true}', sentry.SentryRefused),
        (b"[1, 2, 3]", sentry.SentryRefused),
        (b'{"success": tr', sentry.SentryGone),  # then it hangs up
        (b"\xff\xfe not json at all", sentry.SentryGone),
        (b"{" + b" " * 70_000, sentry.SentryGone),  # more than any answer
    ],
)
async def test_a_peer_that_is_not_the_sentry_is_a_clear_error(
    state_dir: Path, serving: Callable[[Answer], FakeSentry], reply: bytes, raised: type[Exception]
) -> None:
    serving(lambda conn, _call, _fds: conn.sendall(reply))
    pipes = _pipes()
    with pytest.raises(raised):
        await asyncio.wait_for(sentry.start(sentry.Control("c1", state_dir), _args(), stdin=True), 10)
    assert _pipes() == pipes  # nothing of the command's kept open


async def test_no_sentry_listening_is_sentry_gone(state_dir: Path) -> None:
    with pytest.raises(sentry.SentryGone):
        await sentry.start(sentry.Control("nobody", state_dir), _args(), stdin=False)


async def test_a_wait_the_sentry_hangs_up_on_is_reported_killed(
    state_dir: Path, serving: Callable[[Answer], FakeSentry]
) -> None:
    def answer(conn: socket.socket, _call: dict[str, Any], _fds: list[int]) -> None:
        conn.sendall(b'{"success": true, "err": "", "result": 7}')
        conn.recv(65536)  # the wait, never answered: the sandbox stops

    serving(answer)
    command = await sentry.start(sentry.Control("c1", state_dir), _args(), stdin=False)
    assert await asyncio.wait_for(command.wait(), 10) == 137


def _pipes() -> set[str]:
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("pipe:"):
                found.add(fd)
        except OSError:
            continue
    return found


def test_exit_codes_read_as_a_shell_reads_them() -> None:
    assert sentry.exit_code(0) == 0
    assert sentry.exit_code(3 << 8) == 3
    assert sentry.exit_code(9) == 137  # killed by SIGKILL
