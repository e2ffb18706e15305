"""What a sandbox makes the kernel hold stays its own and is charged to it: an abstract unix socket is
reachable only from inside its sandbox, and a flood of directories, of unread socket buffers or of
files on any of its tmpfs mounts (home, /tmp, /dev/shm) is stopped inside the sandbox at its memory
limit, not after taking the host's memory."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from corral.ids import random_hex

from .runtime_serve import Serve

pytestmark = pytest.mark.process


def _memory_cgroup(serve: Serve, sandbox_id: str) -> Path:
    for p in serve.cgroup_dirs(sandbox_id):
        if (p / "memory.max").exists() or (p / "memory.limit_in_bytes").exists():
            return p
    raise AssertionError(f"no memory cgroup for {sandbox_id}")


def _peak_bytes(cgroup: Path) -> int:
    """The most memory the sandbox's cgroup was charged, kernel memory included."""
    for name in ("memory.peak", "memory.max_usage_in_bytes"):
        if (cgroup / name).exists():
            return int((cgroup / name).read_text())
    raise AssertionError(f"no peak usage in {cgroup}")


class _Peak(threading.Thread):
    """The cgroup's peak, read until the flood is over. On gVisor a flood may end the sandbox, and
    its agent removes the cgroup soon after: the last reading before that one stands."""

    def __init__(self, cgroup: Path) -> None:
        super().__init__(daemon=True)
        self.cgroup, self.bytes, self.over = cgroup, _peak_bytes(cgroup), threading.Event()

    def run(self) -> None:
        while not self.over.wait(0.05):
            self.read()

    def read(self) -> None:
        try:
            self.bytes = max(self.bytes, int(_peak_bytes(self.cgroup)))
        except (OSError, ValueError, AssertionError):
            return  # removed with its sandbox

    def __enter__(self) -> _Peak:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.over.set()
        self.join()
        self.read()


# -- abstract unix sockets --------------------------------------------------------------------------

_LISTEN = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\\0" + sys.argv[1].encode())
s.listen(16)
s.settimeout(30)
heard = []
while "done" not in heard:
    conn, _ = s.accept()
    heard.append(conn.recv(64).decode())
    conn.close()
print(" ".join(heard))
"""

_CONNECT = """
import socket, sys
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect(b"\\0" + sys.argv[1].encode())
except OSError as exc:
    print("refused", exc.errno)
    sys.exit(0)
c.sendall(sys.argv[2].encode())
print("connected")
"""

_BIND = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(b"\\0" + sys.argv[1].encode())
print("bound")
"""


@pytest.mark.gvisor_subset
def test_an_abstract_unix_socket_is_reachable_only_inside_its_sandbox(serve: Serve) -> None:
    owner, other = serve.create(), serve.create()
    name = f"corral-held-{random_hex(32)}"
    heard: dict[str, Any] = {}
    listener = threading.Thread(
        target=lambda: heard.update(serve.exec(owner, ["python3", "-c", _LISTEN, name], timeout_s=60))
    )
    listener.start()
    try:
        # A second process of the owner's sandbox reaches it (once the listener is up).
        deadline = time.monotonic() + 30
        while serve.exec(owner, ["python3", "-c", _CONNECT, name, "probe"])["stdout"] != "connected\n":
            assert time.monotonic() < deadline and listener.is_alive(), heard
            time.sleep(0.1)
        # Another sandbox: refused, and the name is free there (a namespace of its own).
        assert serve.exec(other, ["python3", "-c", _CONNECT, name, "other"])["stdout"].split()[0] == "refused"
        assert serve.exec(other, ["python3", "-c", _BIND, name])["stdout"] == "bound\n"
        # The host: refused.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s, pytest.raises(ConnectionRefusedError):
            s.connect(b"\0" + name.encode())
        assert serve.exec(owner, ["python3", "-c", _CONNECT, name, "done"])["stdout"] == "connected\n"
        listener.join(60)
        assert heard["exit_code"] == 0, heard
        words = heard["stdout"].split()
        assert set(words) == {"probe", "done"}, words  # nothing from the other sandbox ever arrived
    finally:
        listener.join(60)
        serve.delete(owner)
        serve.delete(other)


# -- kernel memory ----------------------------------------------------------------------------------

_DIRS = """
import os, sys
limit = int(sys.argv[1])
os.mkdir("/tmp/flood")
fd = os.open("/tmp/flood", os.O_RDONLY)
n = 0
try:
    while n < limit:
        os.mkdir(str(n), dir_fd=fd)
        n += 1
        if n % 5000 == 0:
            print(n, flush=True)
except OSError as exc:
    print("stopped", n, exc.errno, flush=True)
    sys.exit(3)
print("done", n, flush=True)
"""

_SOCKETS = """
import resource, socket, sys
limit = int(sys.argv[1])
_, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
chunk = b"x" * 65536
pairs, queued = [], 0
try:
    while queued < limit:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pairs.append((a, b))
        a.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 30)
        b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 30)
        a.setblocking(False)
        while queued < limit:
            try:
                queued += a.send(chunk)
            except BlockingIOError:
                break
        print(len(pairs), queued, flush=True)
except OSError as exc:
    print("stopped", len(pairs), queued, exc.errno, flush=True)
    sys.exit(3)
print("done", len(pairs), queued, flush=True)
"""


MEMORY_MB = 64
# A directory costs the kernel at least its dentry (192 bytes; its inode is more): a flood charged to
# the sandbox stops within this many. One that is not would run on to its target, GiBs of the host's.
MIN_DIR_BYTES = 192
# The kernel charges a cgroup in batches and may record a peak a little past the limit before it
# refuses or OOM-kills (seen: one page, on gVisor's Sentry); a flood not charged here would be GiBs.
LIMIT_BYTES = MEMORY_MB * 2**20 + 64 * 4096
DIRS_TARGET = 1_000_000
SOCKET_TARGET = 1 << 30  # bytes queued unread, sixteen times the sandbox's memory


def _stopped_inside(serve: Serve, sandbox_id: str, result: dict[str, Any]) -> list[str] | None:
    """The flood ended inside the sandbox: OOM-killed (and reported so) or refused by the kernel (the
    program exits 3 after an error); its last line of progress. On gVisor the flood may take the
    whole sandbox instead: the guest's kernel objects are the Sentry's memory, the Sentry is then the
    cgroup's largest process and the OOM killer's choice, and the sandbox ends (None: no progress
    to read)."""
    lines = [line for line in result["stdout"].split("\n") if line]
    assert not lines or lines[-1].split()[0] != "done", result  # it never reached its target
    if serve.gvisor and result["exit_code"] not in (3, 137):
        serve.wait_stopped(sandbox_id)
        return None
    if result["exit_code"] == 137:
        deadline = time.monotonic() + 30
        while (record := serve.tenant.get(f"/v1/sandboxes/{sandbox_id}").json())["oom_kills"] < 1:
            if serve.gvisor and record["state"] == "stopped":
                # The OOM killer's choice was the Sentry: the sandbox went, and the command says why.
                assert result["oom_killed"] and "out-of-memory" in result["note"], result
                return None
            assert time.monotonic() < deadline, "the OOM kill never reached the sandbox's record"
            time.sleep(0.2)
        return lines[-1].split()
    last = lines[-1].split()
    assert result["exit_code"] == 3 and last[0] == "stopped", result
    return last


def test_a_directory_flood_is_charged_to_the_sandbox(serve: Serve) -> None:
    sid = serve.create(memory_mb=MEMORY_MB)
    try:
        cgroup = _memory_cgroup(serve, sid)
        with _Peak(cgroup) as peak:
            result = serve.exec(sid, ["python3", "-c", _DIRS, str(DIRS_TARGET)], timeout_s=60)
        last = _stopped_inside(serve, sid, result)
        if last is not None:
            made = int(last[1] if last[0] == "stopped" else last[0])
            assert 0 < made < MEMORY_MB * 2**20 // MIN_DIR_BYTES, result["stdout"][-200:]
        assert peak.bytes <= LIMIT_BYTES
    finally:
        serve.delete(sid)


def test_a_socket_buffer_flood_is_charged_to_the_sandbox(serve: Serve) -> None:
    sid = serve.create(memory_mb=MEMORY_MB)
    try:
        cgroup = _memory_cgroup(serve, sid)
        with _Peak(cgroup) as peak:
            result = serve.exec(sid, ["python3", "-c", _SOCKETS, str(SOCKET_TARGET)], timeout_s=60)
        last = _stopped_inside(serve, sid, result)
        assert peak.bytes <= LIMIT_BYTES
        if last is None:
            return  # the whole sandbox ended with it (gVisor)
        queued = int(last[-2] if last[0] == "stopped" else last[1])
        assert 0 < queued < MEMORY_MB * 2**20, result["stdout"][-200:]
        # Only the flood died: its buffers went with it, and the sandbox runs on.
        assert serve.exec(sid, ["echo", "survived"])["stdout"] == "survived\n"
    finally:
        serve.delete(sid)


@pytest.mark.parametrize("directory", ["/tmp", "/home/user", "/dev/shm"])
def test_a_file_flood_on_every_writable_tmpfs_is_charged_to_the_sandbox(serve: Serve, directory: str) -> None:
    sid = serve.create(memory_mb=MEMORY_MB)
    try:
        cgroup = _memory_cgroup(serve, sid)
        fill = f"head -c {4 * MEMORY_MB}M /dev/zero > {directory}/fill; echo written $?"
        with _Peak(cgroup) as peak:
            result = serve.exec(sid, ["sh", "-c", fill], timeout_s=60)
        # The writer is OOM-killed (the shell says so) or refused; never the whole file written.
        assert "written 0" not in result["stdout"], result
        assert peak.bytes <= LIMIT_BYTES
        if serve.gvisor:
            # The file is the Sentry's memory, out of the host's sight; or it took the sandbox with it.
            if "written" not in result["stdout"]:
                serve.wait_stopped(sid)
            return
        # Measured from the host: the sandbox, full of its file, may have no room left to run du.
        written = Path(f"/proc/{serve.init_pid(sid)}/root{directory}/fill").stat().st_size
        assert 0 < written <= MEMORY_MB * 2**20, written
        if "written 137" in result["stdout"]:
            deadline = time.monotonic() + 30
            while serve.tenant.get(f"/v1/sandboxes/{sid}").json()["oom_kills"] < 1:
                assert time.monotonic() < deadline, "the OOM kill never reached the sandbox's record"
                time.sleep(0.2)
    finally:
        serve.delete(sid)
