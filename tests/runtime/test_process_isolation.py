"""What a process sandbox can and cannot see: host processes, hostname, network, filesystem."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.runtime import bwrap
from corral.runtime.base import SandboxSpec
from corral.runtime.process import ProcessRuntime, available, unavailable_reason
from corral.runtime.statedir import Running

pytestmark = pytest.mark.process

_CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(2)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print(s.recv(16).decode())
except OSError as exc:
    print("refused", type(exc).__name__)
"""


@pytest.fixture
async def host_listener() -> AsyncIterator[int]:
    """A TCP server on the host's loopback that greets whoever connects."""

    async def greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello-from-host")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(greet, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


def test_available_here() -> None:
    # These machines have bubblewrap (make system-deps) and namespaces: the runtime must not skip.
    assert unavailable_reason() is None
    assert available()
    assert ProcessRuntime.available()


async def test_sandbox_cannot_see_host_processes(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="pids", memory_mb=128))
    result = await process_runtime.exec("pids", ["sh", "-c", "ls /proc | grep -E '^[0-9]+$'"])
    assert result.exit_code == 0, result.stderr
    visible = {int(pid) for pid in result.stdout.split()}
    # Only the sandbox's own few processes, numbered from 1 in its own pid namespace.
    assert 1 in visible
    assert len(visible) < 10
    host_pids = {int(name) for name in os.listdir("/proc") if name.isdigit()}
    assert len(host_pids) > len(visible)
    init = await process_runtime.exec("pids", ["cat", "/proc/1/cmdline"])
    # The sandbox's pid 1 is its own init, not the host's.
    assert init.stdout.split("\0")[0] == bwrap.INIT_PATH


async def test_sandbox_has_its_own_hostname(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="named", memory_mb=128, hostname="box-7"))
    await process_runtime.start(SandboxSpec(id="by-id", memory_mb=128))
    assert (await process_runtime.exec("named", ["hostname"])).stdout.strip() == "box-7"
    assert (await process_runtime.exec("by-id", ["hostname"])).stdout.strip() == "by-id"
    assert os.uname().nodename not in ("box-7", "by-id")


async def test_no_network_but_its_own_loopback(process_runtime: ProcessRuntime, host_listener: int) -> None:
    await process_runtime.start(SandboxSpec(id="offline", memory_mb=128))
    links = await process_runtime.exec("offline", ["cat", "/proc/net/dev"])
    interfaces = [line.split(":")[0].strip() for line in links.stdout.splitlines()[2:]]
    assert interfaces == ["lo"]
    # The host's loopback is another namespace's: the host's listener is unreachable.
    reached = await process_runtime.exec("offline", ["python3", "-c", _CONNECT, str(host_listener)])
    assert reached.stdout.startswith("refused"), reached.stdout
    # Its own loopback works.
    local = await process_runtime.exec(
        "offline",
        [
            "python3",
            "-c",
            "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen();"
            "c = socket.create_connection(s.getsockname()); print('loopback ok')",
        ],
    )
    assert local.stdout.strip() == "loopback ok", local.stderr


async def test_network_when_asked(process_runtime: ProcessRuntime, host_listener: int) -> None:
    await process_runtime.start(SandboxSpec(id="online", memory_mb=128, network=True))
    reached = await process_runtime.exec("online", ["python3", "-c", _CONNECT, str(host_listener)])
    assert reached.stdout.strip() == "hello-from-host", reached.stdout + reached.stderr


async def test_filesystem_view(process_runtime: ProcessRuntime, tmp_path: object) -> None:
    await process_runtime.start(SandboxSpec(id="fs", memory_mb=128))
    # A private, writable home and /tmp.
    wrote = await process_runtime.exec(
        "fs", ["sh", "-c", "echo kept > note && cat $HOME/note && touch /tmp/t"]
    )
    assert wrote.exit_code == 0 and wrote.stdout.strip() == "kept", wrote.stderr
    assert (await process_runtime.exec("fs", ["cat", "note"])).stdout.strip() == "kept"
    # System directories are there but read-only.
    denied = await process_runtime.exec("fs", ["touch", "/usr/corral-should-not-exist"])
    assert denied.exit_code != 0
    assert not os.path.exists("/usr/corral-should-not-exist")
    # Nothing else of the host: not its working trees, not root's home.
    listing = await process_runtime.exec("fs", ["ls", "/"])
    assert set(listing.stdout.split()) <= {"bin", "dev", "etc", "home", "lib", "lib32", "lib64", "libx32"} | {
        "proc",
        "sbin",
        "tmp",
        "usr",
    }
    # The sandbox user is unprivileged and named; the host's account list is not shown.
    who = await process_runtime.exec("fs", ["id", "-un"])
    assert who.stdout.strip() == "user"
    passwd = await process_runtime.exec("fs", ["cat", "/etc/passwd"])
    assert "user:x:1000" in passwd.stdout
    shadow = await process_runtime.exec("fs", ["cat", "/etc/shadow"])
    assert shadow.exit_code != 0


async def test_sandboxes_do_not_share_files(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="a", memory_mb=128))
    await process_runtime.start(SandboxSpec(id="b", memory_mb=128))
    await process_runtime.exec("a", ["sh", "-c", "echo secret > $HOME/s && echo secret > /tmp/s"])
    peek = await process_runtime.exec("b", ["sh", "-c", "cat $HOME/s /tmp/s"])
    assert peek.exit_code != 0
    assert "secret" not in peek.stdout


async def test_spec_env_is_not_on_any_command_line(process_runtime: ProcessRuntime) -> None:
    await process_runtime.start(SandboxSpec(id="secret", memory_mb=64, env={"API_KEY": "s3cr3t-value"}))
    record = process_runtime.statedir.load("secret")
    assert isinstance(record, Running)
    for pid in (record.monitor.pid, record.init.pid):
        assert b"s3cr3t-value" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    inside = await process_runtime.exec("secret", ["sh", "-c", 'echo "$API_KEY"; cat /proc/1/cmdline'])
    assert inside.stdout.startswith("s3cr3t-value\n")
    assert "s3cr3t-value" not in inside.stdout.split("\n", 1)[1]
