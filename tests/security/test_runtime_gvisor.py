"""A hostile tenant against ``corral serve --runtime gvisor``: between its processes and the host's
kernel stands gVisor's. What held on the process runtime holds here too (no privilege, no host port,
no host account, no other sandbox, nothing of the host on a command line or in a descriptor), and the
host's kernel, processes and /proc are out of sight."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from .runtime_serve import Serve, running_serve

pytestmark = pytest.mark.process


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    yield from running_serve(tmp_path_factory, runtime="gvisor", hosts=1)


def test_the_kernel_a_tenant_meets_is_gvisor_s(serve: Serve) -> None:
    sid = serve.create()
    out = serve.exec_python(
        sid,
        "import json, os; print(json.dumps({'release': os.uname().release,"
        " 'pids': sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),"
        " 'cmdline': open('/proc/1/cmdline').read()}))",
    )
    assert out["release"] != os.uname().release  # gVisor's kernel answers, not the host's
    assert out["cmdline"].split("\0")[0] == "/.corral/init"  # its own pid 1
    assert len(out["pids"]) < 10  # its own few processes; none of the host's
    assert os.getpid() not in out["pids"] or len(out["pids"]) < 10
    serve.delete(sid)


def test_an_exec_holds_no_privilege(serve: Serve) -> None:
    sid = serve.create()
    status = serve.exec(sid, ["cat", "/proc/self/status"])["stdout"]
    caps = {line.split(":")[0]: line.split()[1] for line in status.splitlines() if line.startswith("Cap")}
    assert caps and all(int(v, 16) == 0 for k, v in caps.items() if k != "CapBnd"), caps
    assert "NoNewPrivs:\t1" in status or "NoNewPrivs" not in status
    who = serve.exec(sid, ["id", "-u"])
    assert who["stdout"].strip() == "1000"
    for target in ("/usr/bin/corral-owned", "/etc/passwd", "/bin/sh"):
        wrote = serve.exec(sid, ["sh", "-c", f"echo x >> {target}"])
        assert wrote["exit_code"] != 0, target
    serve.delete(sid)


def _listening_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


def test_a_sandbox_reaches_no_host_port(serve: Serve) -> None:
    listener, port = _listening_port()
    try:
        sid = serve.create()
        program = (
            "import socket, sys, json\n"
            "out = {}\n"
            "for port in [int(p) for p in sys.argv[1:]]:\n"
            "    s = socket.socket(); s.settimeout(2)\n"
            "    try:\n"
            "        s.connect(('127.0.0.1', port)); out[port] = 'connected'\n"
            "    except OSError as e:\n"
            "        out[port] = type(e).__name__\n"
            "print(json.dumps(out))\n"
        )
        got = serve.exec_python(sid, program, str(port), str(serve.port), "5432")
        assert all(v != "connected" for v in got.values()), got
        serve.delete(sid)
    finally:
        listener.close()


def test_one_sandbox_sees_and_signals_nothing_of_another(serve: Serve) -> None:
    a, b = serve.create(), serve.create()
    marker = "sleep 3011"
    serve.exec(b, ["sh", "-c", f"{marker} >/dev/null 2>&1 &"])
    seen = serve.exec(a, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])["stdout"]
    assert "3011" not in seen
    killed = serve.exec(a, ["sh", "-c", "kill -9 -1; echo done"])
    assert "done" in killed["stdout"] or killed["exit_code"] != 0
    still = serve.exec(b, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])["stdout"]
    assert "3011" in still  # b's process outlived a's attempt
    serve.delete(a)
    serve.delete(b)


def test_nothing_of_the_tenant_is_on_a_host_command_line_and_nothing_of_the_host_in_its_descriptors(
    serve: Serve,
) -> None:
    sid = serve.create(env={"SECRETISH": "env-marker-5b1e"})
    marker = "argv-marker-77a1"
    serve.exec(sid, ["sh", "-c", f"python3 -c 'import time; time.sleep(30)' {marker} >/dev/null 2>&1 &"])
    assert marker in serve.exec(sid, ["sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"])["stdout"]
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert marker.encode() not in cmdline and b"env-marker-5b1e" not in cmdline
    fds = serve.exec(sid, ["sh", "-c", "for f in /proc/1/fd/*; do readlink $f; done"])["stdout"]
    assert str(serve.state) not in fds and "host-" not in fds
    serve.delete(sid)


def test_the_host_s_accounts_and_files_are_not_visible(serve: Serve) -> None:
    sid = serve.create()
    passwd = serve.exec(sid, ["cat", "/etc/passwd"])["stdout"]
    assert [line.split(":")[0] for line in passwd.splitlines()] == ["root", "user", "nobody"]
    assert serve.exec(sid, ["cat", "/etc/shadow"])["exit_code"] != 0
    listing = serve.exec_python(sid, "import json, os; print(json.dumps(sorted(os.listdir('/'))))")
    assert "root" not in listing and "work" not in listing and "var" not in listing
    serve.delete(sid)


def test_a_sandbox_s_files_stay_within_its_memory(serve: Serve) -> None:
    """Its writable places are sized to its memory: a tenant that writes without end gets ENOSPC (or is
    killed) and the host's disk is as it was."""
    before = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    sid = serve.create(memory_mb=128)
    wrote = serve.exec(
        sid, ["sh", "-c", "dd if=/dev/zero of=/tmp/fill bs=1M count=1024; echo rc=$?"], timeout_s=60
    )
    assert "rc=0" not in wrote["stdout"] or wrote["exit_code"] != 0
    after = os.statvfs("/").f_bavail * os.statvfs("/").f_frsize
    assert before - after < 256 * 1024 * 1024
    serve.delete(sid)


def test_a_sandbox_that_is_deleted_leaves_nothing(serve: Serve) -> None:
    sid = serve.create()
    assert serve.exec(sid, ["true"])["exit_code"] == 0
    serve.delete(sid)
    assert not list(serve.state.glob(f"*/sandboxes/{sid}"))
    r = serve.tenant.get(f"/v1/sandboxes/{sid}")
    assert r.status_code in (404, 200) and (r.status_code == 404 or r.json()["state"] == "deleted")
    rt_state = [json.loads(p.read_text()) for p in serve.state.glob("*/runsc/*/*.json") if p.is_file()]
    assert not [s for s in rt_state if sid in json.dumps(s)]
