"""An output flood is bounded at the API: an exec writing 1 GiB to stdout gets an answer of a few MB,
marked truncated, while the server's memory stays flat and it keeps answering everyone else."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from corral.runtime.capture import DEFAULT_LIMIT

from .runtime_serve import Serve

pytestmark = pytest.mark.process

GIB = 1 << 30
MAX_ANSWER_BYTES = 4 * DEFAULT_LIMIT  # both streams kept whole, JSON-escaped, with room to spare
MAX_RSS_GROWTH_KB = 100 * 1024
_WRITE_A_GIB = f"""
import os
chunk = b"x" * (1 << 20)
for _ in range({GIB} >> 20):
    os.write(1, chunk)
"""


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


def test_a_gib_of_stdout_is_cut_at_the_bound_and_the_server_stays_flat(serve: Serve) -> None:
    flood, calm = serve.create(), serve.create()
    pid = serve.proc.popen.pid
    try:
        serve.exec(flood, ["echo", "warm"])  # what the first exec loads is not the flood's
        rss_before = _status_kb(pid, "VmRSS")
        # From here the peak is the flood's (where the kernel lets the owner reset it).
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        answer: dict[str, Any] = {}

        def run() -> None:
            r = serve.tenant.post(
                f"/v1/sandboxes/{flood}/exec",
                json={"command": ["python3", "-c", _WRITE_A_GIB], "timeout_s": 20},
            )
            answer.update(status=r.status_code, size=len(r.content), body=r.json())

        thread = threading.Thread(target=run)
        thread.start()
        answered = 0
        while thread.is_alive():  # everyone else is still served meanwhile
            assert serve.tenant.get(f"/v1/sandboxes/{calm}").status_code == 200
            assert serve.exec(calm, ["echo", "still here"])["stdout"] == "still here\n"
            answered += 1
        thread.join()
        assert answered >= 1
        assert answer["status"] == 200, answer["body"]
        body = answer["body"]
        assert answer["size"] <= MAX_ANSWER_BYTES, answer["size"]
        assert body["truncated"] is True
        assert 0 < len(body["stdout"]) <= DEFAULT_LIMIT and set(body["stdout"]) == {"x"}
        peak = _status_kb(pid, "VmHWM")
        assert peak - rss_before < MAX_RSS_GROWTH_KB, (rss_before, peak)
        assert _status_kb(pid, "VmRSS") - rss_before < MAX_RSS_GROWTH_KB
        assert serve.exec(flood, ["echo", "after"])["stdout"] == "after\n"
    finally:
        serve.delete(flood)
        serve.delete(calm)
