"""Running one job of :mod:`corral.images.jail` from the event loop: its output streamed line by line
to a log, a deadline, and cancellation that kills the job's whole process group (bubblewrap's
sandbox dies with it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Log = Callable[[str], None]
TAIL_BYTES = 16 * 1024
_LINE_BYTES = 4096
_CHUNK = 4096


@dataclass(frozen=True, slots=True)
class JobResult:
    code: int  # the job's exit status; None never (a timed-out job raises)
    tail: str  # the last TAIL_BYTES of its output


class JobTimedOut(Exception):
    def __init__(self, tail: str) -> None:
        super().__init__("the job ran past its deadline")
        self.tail = tail


class _Lines:
    """Output bytes cut into lines for the log (long lines cut too) and a bounded tail."""

    def __init__(self, log: Log | None) -> None:
        self.log = log
        self.pending = b""
        self.tail = bytearray()

    def feed(self, data: bytes) -> None:
        self.tail += data
        del self.tail[: max(0, len(self.tail) - TAIL_BYTES)]
        self.pending += data
        while b"\n" in self.pending or len(self.pending) > _LINE_BYTES:
            cut = self.pending.find(b"\n")
            cut = _LINE_BYTES if cut < 0 or cut > _LINE_BYTES else cut
            self._emit(self.pending[:cut])
            self.pending = self.pending[cut + 1 if self.pending[cut : cut + 1] == b"\n" else cut :]

    def close(self) -> None:
        if self.pending:
            self._emit(self.pending)
            self.pending = b""

    def _emit(self, line: bytes) -> None:
        if self.log is not None:
            self.log(line.decode(errors="replace"))

    def text(self) -> str:
        return bytes(self.tail).decode(errors="replace")


async def run_job(job: dict[str, Any], *, timeout_s: float, log: Log | None = None) -> JobResult:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "corral.images.jail",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
        env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"), "LANG": "C.UTF-8"},
    )
    assert proc.stdin is not None and proc.stdout is not None
    lines = _Lines(log)
    try:
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()

        async def pump() -> None:
            assert proc.stdout is not None
            while chunk := await proc.stdout.read(_CHUNK):
                lines.feed(chunk)
            lines.close()

        try:
            await asyncio.wait_for(pump(), timeout_s)
            code = await asyncio.wait_for(proc.wait(), max(1.0, timeout_s))
        except TimeoutError:
            raise JobTimedOut(lines.text()) from None
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    return JobResult(code=code, tail=lines.text())
