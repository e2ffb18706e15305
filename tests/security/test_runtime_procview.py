"""What a sandbox learns of its host from /proc: nothing of its boot line, memory, load, disks or
pressure (the sandbox sees its own figures or none), and no file, link or variable it can read names
the runtime's state directory or the host's id. The usual tools still work on the sandbox's view."""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from .runtime_serve import Serve, runtime_root

pytestmark = pytest.mark.process

MEMORY_MB = 128

# The host-describing files, then everything the tenant can read of pid 1 and of itself (files and
# links under /proc/<pid>, one level down), its environment and its hostname. JSON on stdout.
_LOOK = r"""
import json, os, socket
def read(path):
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16).decode(errors="replace")
    except OSError as exc:
        return exc.errno
pressure = os.listdir("/proc/pressure") if os.path.isdir("/proc/pressure") else []
report = {"files": {}, "pressure": pressure, "seen": {}}
for name in ("cmdline", "meminfo", "loadavg", "diskstats", "partitions", "swaps", "config.gz"):
    report["files"][name] = read(f"/proc/{name}")
for pid in ("1", "self"):
    for entry in sorted(os.listdir(f"/proc/{pid}")):
        path = f"/proc/{pid}/{entry}"
        if os.path.islink(path):
            try:
                report["seen"][path] = os.readlink(path)
            except OSError as exc:
                report["seen"][path] = exc.errno
        elif os.path.isdir(path):
            try:
                names = os.listdir(path)
            except OSError as exc:
                report["seen"][path] = exc.errno
                continue
            for name in names:
                inner = f"{path}/{name}"
                if os.path.islink(inner):
                    try:
                        report["seen"][inner] = os.readlink(inner)
                    except OSError as exc:
                        report["seen"][inner] = exc.errno
        else:
            report["seen"][path] = read(path)
report["seen"]["environ"] = dict(os.environ)
report["seen"]["hostname"] = socket.gethostname()
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def sandbox(serve: Serve) -> Iterator[str]:
    sid = serve.create(memory_mb=MEMORY_MB)
    yield sid
    serve.delete(sid)


def _meminfo_kb(text: str, field: str) -> int:
    match = re.search(rf"^{field}:\s+(\d+) kB$", text, re.M)
    assert match, (field, text)
    return int(match.group(1))


def test_proc_describes_the_sandbox_not_the_host(serve: Serve, sandbox: str) -> None:
    host = {
        name: Path(f"/proc/{name}").read_text() for name in ("cmdline", "meminfo", "loadavg", "diskstats")
    }
    inside = serve.exec_python(sandbox, _LOOK)
    files = inside["files"]
    # The host's boot line is not there.
    assert host["cmdline"].strip() and host["cmdline"].strip() not in files["cmdline"]
    # Load: no figure of the host's (its thread count is in the fourth field).
    host_tasks = int(host["loadavg"].split()[3].split("/")[1])
    inside_load = files["loadavg"].split()
    assert [float(x) for x in inside_load[:3]] == [0.0, 0.0, 0.0]
    assert int(inside_load[3].split("/")[1]) < host_tasks
    # Disks, partitions and swap devices: none of the host's.
    host_disks = {line.split()[2] for line in host["diskstats"].splitlines()}
    assert host_disks, "the host has disks of its own to hide"
    for name in ("diskstats", "partitions", "swaps"):
        assert not host_disks & set(str(files[name]).split()), (name, files[name])
    # Pressure stall figures and the kernel's build configuration: hidden.
    if os.path.isdir("/proc/pressure"):
        assert os.listdir("/proc/pressure") and inside["pressure"] == []
    if os.path.exists("/proc/config.gz"):
        assert Path("/proc/config.gz").read_bytes() and files["config.gz"] in ("", errno.ENOENT)
    # Memory: the sandbox's own limit, no swap; nothing of the host's total.
    assert _meminfo_kb(files["meminfo"], "MemTotal") == MEMORY_MB * 1024
    assert _meminfo_kb(files["meminfo"], "MemAvailable") <= MEMORY_MB * 1024
    assert _meminfo_kb(files["meminfo"], "SwapTotal") == 0
    host_total = _meminfo_kb(host["meminfo"], "MemTotal")
    assert host_total != MEMORY_MB * 1024 and str(host_total) not in files["meminfo"]


@pytest.mark.gvisor_subset
def test_nothing_readable_names_the_hosts_state_or_id(serve: Serve, sandbox: str) -> None:
    root = runtime_root(serve, sandbox)
    forbidden = [str(serve.state), str(root), root.name]  # <state dir>, <state dir>/host-NN, host-NN
    inside = serve.exec_python(sandbox, _LOOK)
    seen = inside["seen"]
    assert "/proc/self/mountinfo" in seen and "/proc/self/cgroup" in seen and "/proc/1/cmdline" in seen
    leaks = {path: value for path, value in seen.items() for word in forbidden if word in str(value)}
    assert leaks == {}, leaks
    if serve.gvisor:
        return  # pid 1 is gVisor's task, its descriptors the guest's own: what leaks was checked above
    # pid 1 keeps its descriptors, environment and cwd to itself (it is not dumpable).
    for closed in ("/proc/1/fd", "/proc/1/environ", "/proc/1/cwd", "/proc/1/root"):
        assert isinstance(seen[closed], int), (closed, seen[closed])


@pytest.mark.parametrize(
    "command",
    [
        ["free", "-m"],
        ["ps", "-ef"],
        ["top", "-b", "-n", "1"],
        ["python3", "-c", "import os; print(os.cpu_count())"],
    ],
)
def test_the_usual_tools_work_on_the_sandboxs_view(serve: Serve, sandbox: str, command: list[str]) -> None:
    result = serve.exec(sandbox, command)
    assert result["exit_code"] == 0 and result["stdout"], result
    if command[0] == "free":
        assert result["stdout"].splitlines()[1].split()[1] == str(MEMORY_MB)
    if command[0] == "python3":
        assert int(result["stdout"]) == os.cpu_count()
