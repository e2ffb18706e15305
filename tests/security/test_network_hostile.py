"""A sandbox attacking the network from its slot (a lab of the test's own, corral.testing.netlab, as the
internet): datagrams with a source address not its own (another sandbox's, its gateway's, a lab
server's, any), by every means an unprivileged process has, reach nobody; and it can touch neither
its neighbour table nor its link (no forged ARP answers, no other address claimed on the veth), so
the host's neighbour table for its link names the sandbox's own address only."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.agent import netns
from corral.agent.netslots import SlotPool
from corral.core.netpolicy import INTERNET
from corral.runtime.base import Runtime
from corral.runtime.gvisor import GvisorRuntime
from corral.testing import netlab
from tests.runtime.conftest import cgroup_root, make_process_runtime
from tests.runtime.slots import emptied, lab, runtime, slot_runtime, started

__all__ = ["cgroup_root", "lab", "make_process_runtime", "runtime", "slot_runtime"]

pytestmark = [
    pytest.mark.process,
    pytest.mark.usefixtures("runtime_name"),
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.tools_missing()), reason="slots need root, ip, nft"),
]

_RANGE = ipaddress.IPv4Network("10.232.22.0/28")
_PORT = 9999

# Sends one datagram to argv[1]:9999 from its own address ("own"), then tries each source of argv[2:]
# every way an unprivileged process might; prints what each attempt gave, one per line.
_SPOOF = r"""
import socket, sys
target, sources = sys.argv[1], sys.argv[2:]
IP_FREEBIND, IP_TRANSPARENT = 15, 19

def attempt(label, make):
    try:
        make()
        print(label, "sent")
    except OSError as exc:
        print(label, type(exc).__name__)

def plain():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.sendto(b"own", (target, 9999))

def freebind(source):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_IP, IP_FREEBIND, 1)
    s.bind((source, 0))
    s.sendto(b"freebind " + source.encode(), (target, 9999))

def transparent(source):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
    s.bind((source, 0))
    s.sendto(b"transparent " + source.encode(), (target, 9999))

def raw(source):
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_UDP)
    s.sendto(b"raw " + source.encode(), (target, 9999))

attempt("own", plain)
for source in sources:
    for name, how in (("freebind", freebind), ("transparent", transparent), ("raw", raw)):
        attempt(f"{name} {source}", lambda: how(source))
"""

# Listens on UDP 9999 in the lab's namespace; prints each payload received until killed.
_LISTEN = r"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 9999))
print("ready", flush=True)
while True:
    print(s.recv(4096).decode(errors="replace"), flush=True)
"""


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[SlotPool]:
    made = SlotPool(tmp_path / "netslots", size=0, lease_dir=tmp_path / "leases", slot_range=_RANGE)
    async for ready in emptied(made):
        yield ready


async def _start(runtime: Runtime, pool: SlotPool, sandbox_id: str) -> None:
    await started(runtime, pool, sandbox_id, INTERNET)


@pytest.mark.gvisor_subset
async def test_no_datagram_with_a_source_not_its_own_leaves_a_sandbox(
    runtime: Runtime, pool: SlotPool, lab: netlab.Lab
) -> None:
    await _start(runtime, pool, "spoofer")
    await _start(runtime, pool, "victim")
    mine, victim = pool.slot_of("spoofer"), pool.slot_of("victim")
    assert mine is not None and victim is not None
    sources = [str(victim.sandbox_ip), str(mine.host_ip), str(netlab.DENIED), "198.51.100.99"]
    listener = subprocess.Popen(
        ["ip", "netns", "exec", lab.netns, sys.executable, "-c", _LISTEN],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        argv = ["python3", "-c", _SPOOF, str(netlab.ALLOWED), *sources]
        result = await runtime.exec("spoofer", argv, timeout_s=30)
        assert result.exit_code == 0, result.stderr
        attempts = dict(line.rsplit(" ", 1) for line in result.stdout.strip().splitlines())
        got = _received(listener, until="own")
        # The host's lock behind the sandbox's: a process of the slot's namespace with every
        # privilege (a sandbox that escaped all but its namespace) writes whole packets; only the
        # one with the slot's own source passes the host.
        forged = [str(mine.sandbox_ip), *sources]
        inject = ["ip", "netns", "exec", mine.netns, sys.executable, "-c", _RAW, str(netlab.ALLOWED), *forged]
        subprocess.run(inject, check=True, capture_output=True, timeout=30)
        raw = _received(listener, until=f"raw {mine.sandbox_ip}")
    finally:
        listener.kill()
        listener.wait()
    # The control datagram arrived (the path works); no other did, whatever the sandbox was told.
    assert attempts["own"] == "sent" and got == ["own"], (got, attempts)
    # What would need a capability fails for the lack of it; gVisor's kernel offers neither raw
    # sockets (runsc runs without --net-raw) nor IP_TRANSPARENT at all.
    refused = "OSError" if isinstance(runtime, GvisorRuntime) else "PermissionError"
    for source in sources:
        # Binding to another address fails (freebind sends from no address but the sandbox's own).
        assert attempts[f"freebind {source}"] == "OSError", attempts
        assert attempts[f"transparent {source}"] == refused, attempts
        assert attempts[f"raw {source}"] == refused, attempts
    assert raw == [f"raw {mine.sandbox_ip}"], raw


# Writes one UDP packet to argv[1]:9999 from each source of argv[2:], whole (IP_HDRINCL): root only.
_RAW = r"""
import socket, struct, sys
target = sys.argv[1]
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for source in sys.argv[2:]:
    payload = b"raw " + source.encode()
    udp = struct.pack(">HHHH", 40000, 9999, 8 + len(payload), 0) + payload
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 0, 0, 64, socket.IPPROTO_UDP, 0,
                     socket.inet_aton(source), socket.inet_aton(target))
    s.sendto(ip + udp, (target, 0))
"""


def _received(listener: subprocess.Popen[str], *, until: str) -> list[str]:
    """The payloads the lab's listener printed: all of them up to ``until``, then whatever else
    arrives within a second (the spoofed datagrams were sent after it)."""
    assert listener.stdout is not None
    os.set_blocking(listener.stdout.fileno(), False)
    got: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = listener.stdout.readline()
        if line:
            got.append(line.strip())
            if line.strip() == until:
                deadline = min(deadline, time.monotonic() + 1)
        else:
            time.sleep(0.05)
    return got


async def test_a_sandbox_can_neither_forge_neighbours_nor_claim_addresses_on_its_link(
    runtime: Runtime, pool: SlotPool, lab: netlab.Lab
) -> None:
    await _start(runtime, pool, "arp")
    slot = pool.slot_of("arp")
    assert slot is not None
    fake = "02:00:00:00:00:01"
    tricks = [
        ["ip", "neigh", "replace", str(slot.host_ip), "lladdr", fake, "dev", "eth0"],
        ["ip", "neigh", "add", str(netlab.ALLOWED), "lladdr", fake, "dev", "eth0"],
        ["ip", "link", "set", "eth0", "address", fake],
        ["ip", "link", "set", "eth0", "arp", "off"],
        ["ip", "link", "set", "eth0", "promisc", "on"],
        ["ip", "addr", "add", f"{slot.host_ip}/32", "dev", "eth0"],
        ["ip", "route", "replace", "default", "via", str(slot.host_ip), "src", str(netlab.DENIED)],
    ]
    for trick in tricks:
        done = await runtime.exec("arp", trick)
        assert done.exit_code != 0, (trick, done.stdout)
    # It still reaches the lab as itself, and the host knows its link's neighbour as its own address.
    probe = ["python3", "-c", _GET, f"http://{netlab.ALLOWED}:{netlab.PORT}/"]
    assert (await runtime.exec("arp", probe)).stdout.strip() == str(netlab.ALLOWED)
    neighbours = subprocess.run(
        ["ip", "-4", "neigh", "show", "dev", slot.host_if], capture_output=True, text=True, check=True
    ).stdout.split()
    assert neighbours[0] == str(slot.sandbox_ip) and fake not in neighbours
    addresses = [w for w in neighbours if w.count(".") == 3]
    assert addresses == [str(slot.sandbox_ip)], neighbours


_GET = """
import sys, urllib.request
print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
"""
