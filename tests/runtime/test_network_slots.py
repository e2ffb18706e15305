"""Network slots with real sandboxes: a process sandbox joined to its slot reaches what its policy
allows in a lab "internet" of the test's own (never an outside address), and nothing of the host,
the metadata address or another sandbox, whatever the policy; a returned slot carries nothing of its
last sandbox; a drained pool builds on demand."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from corral.agent import netns
from corral.agent.netslots import SlotPool, reclaim_under
from corral.core.netpolicy import (
    INTERNET,
    NO_NETWORK,
    TABLE,
    EgressPolicy,
    SlotNet,
    parse_policy,
    render_table,
    slot_count,
    slot_net,
)
from corral.runtime.base import SandboxSpec
from corral.runtime.gvisor import GvisorRuntime
from corral.runtime.process import ProcessRuntime
from corral.testing import netlab
from tests.runtime.slots import BOTH, emptied, lab, runtime, slot_runtime, started

__all__ = ["lab", "runtime", "slot_runtime"]

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.tools_missing()), reason="slots need root, ip, nft"),
]

# Prints what one TCP connect (and, for HTTP ports, a GET) gave: the body, or the error's class.
_PROBE = """
import socket, sys
from concurrent.futures import ThreadPoolExecutor
port = int(sys.argv[1])
def probe(host):
    s = socket.socket()
    s.settimeout(1.5)
    try:
        s.connect((host, port))
        s.sendall(b"GET / HTTP/1.0\\r\\nHost: x\\r\\n\\r\\n")
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return "open " + data.split(b"\\r\\n\\r\\n", 1)[-1].decode(errors="replace")
    except OSError as exc:
        return "closed " + type(exc).__name__
    finally:
        s.close()
# In parallel (a host with many addresses would otherwise take 1.5 s for each dropped one), in order.
with ThreadPoolExecutor(16) as pool:
    for line in pool.map(probe, sys.argv[2:]):
        print(line)
"""


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[SlotPool]:
    made = SlotPool(tmp_path / "netslots", size=1, operator_allow=[ipaddress.IPv4Network("10.98.0.0/24")])
    async for ready in emptied(made):
        yield ready
    assert not made.in_use and not made.ready


async def _sandbox(runtime: ProcessRuntime, pool: SlotPool, sandbox_id: str, policy: EgressPolicy) -> str:
    return str((await started(runtime, pool, sandbox_id, policy)).sandbox_ip)


async def _probes(runtime: ProcessRuntime, sandbox_id: str, hosts: list[object], port: int) -> list[str]:
    """What a connect (and a GET) from inside the sandbox to each of ``hosts`` gave, in order."""
    argv = ["python3", "-c", _PROBE, str(port), *map(str, hosts)]
    result = await runtime.exec(sandbox_id, argv, timeout_s=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip().splitlines()


async def _probe(runtime: ProcessRuntime, sandbox_id: str, host: object, port: int = netlab.PORT) -> str:
    return (await _probes(runtime, sandbox_id, [host], port))[0]


def _host_addresses() -> list[str]:
    out = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    return [line.split()[3].split("/")[0] for line in out.splitlines()]


@pytest.mark.parametrize("slot_runtime", BOTH, indirect=True)
async def test_policy_allow_wins_and_the_host_stays_out_of_reach(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab
) -> None:
    # E2B's precedence: deny everything, allow one address; the allowed one answers, the other not.
    listed = parse_policy({"mode": "internet", "allow_out": [str(netlab.ALLOWED)], "deny_out": ["0.0.0.0/0"]})
    mine = await _sandbox(runtime, pool, "a", listed)
    other = await _sandbox(runtime, pool, "b", INTERNET)
    assert await _probe(runtime, "a", netlab.ALLOWED) == f"open {netlab.ALLOWED}"
    assert (await _probe(runtime, "a", netlab.DENIED)).startswith("closed")
    # Internet: both lab addresses; the private one only because the operator allowed its range.
    lab_addresses: list[object] = [netlab.ALLOWED, netlab.DENIED, netlab.PRIVATE]
    got = await _probes(runtime, "b", lab_addresses, netlab.PORT)
    assert got == [f"open {address}" for address in lab_addresses]
    # Its own interface, with its own address, which it cannot change.
    inside = await runtime.exec("a", ["cat", "/proc/net/dev"])
    assert "eth0" in inside.stdout
    tamper = await runtime.exec("a", ["python3", "-c", _TAMPER])
    if isinstance(runtime, GvisorRuntime):
        # The Sentry offers neither raw nor packet sockets (runsc runs without --net-raw): the
        # family is not there at all, rather than refused for a capability.
        assert tamper.stdout.split() == ["EAFNOSUPPORT", "EAFNOSUPPORT", "refused"], tamper
    else:
        assert tamper.stdout.split() == ["EPERM", "EPERM", "refused"], tamper

    # Whatever the policy: the host's own addresses and loopback services, the metadata address,
    # another sandbox. A service on the host's loopback stands in for PostgreSQL, the API, the agent.
    server = await asyncio.start_server(_greet, "0.0.0.0", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for sandbox_id, peer in (("a", other), ("b", mine)):
            targets: list[object] = [*_host_addresses(), "127.0.0.1", "169.254.169.254", peer]
            got = await _probes(runtime, sandbox_id, targets, port)
            assert all(g.startswith("closed") for g in got), (
                sandbox_id,
                list(zip(targets, got, strict=True)),
            )
    finally:
        server.close()
    await server.wait_closed()


_TAMPER = """
import errno, socket, subprocess
for attempt in (
    lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW),
    lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW),
):
    try:
        attempt()
        print("allowed")
    except OSError as exc:
        print(errno.errorcode.get(exc.errno or 0, "OSError"))
r = subprocess.run(["ip", "addr", "add", "198.51.100.10/32", "dev", "eth0"], capture_output=True)
print("refused" if r.returncode != 0 else "allowed")
"""


async def _greet(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.0 200 OK\r\n\r\nhost-service")
    await writer.drain()
    writer.close()


@pytest.mark.parametrize("slot_runtime", BOTH, indirect=True)
async def test_policy_changes_atomically_under_an_open_connection(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab
) -> None:
    await _sandbox(runtime, pool, "live", INTERNET)
    stream = await runtime.spawn(
        "live", ["python3", "-c", _STREAM, lab.url(netlab.DENIED, "/stream")], env={"PYTHONUNBUFFERED": "1"}
    )
    assert (await asyncio.wait_for(stream.stdout.readline(), 5)).strip() == b"line"
    await pool.apply("live", parse_policy({"deny_out": [str(netlab.DENIED)]}))
    # The open connection is cut: the stream stops, and a new connection is refused at once.
    assert (await asyncio.wait_for(stream.stdout.readline(), 10)).strip() == b"stalled"
    assert (await _probe(runtime, "live", netlab.DENIED)).startswith("closed")
    assert await _probe(runtime, "live", netlab.ALLOWED) == f"open {netlab.ALLOWED}"
    assert await stream.wait() == 0


_STREAM = """
import socket, sys, urllib.request
r = urllib.request.urlopen(sys.argv[1], timeout=1)
r.readline()
print("line")
try:
    while r.readline():
        pass
except (OSError, socket.timeout):
    pass
print("stalled")
"""


async def test_a_returned_slot_is_scrubbed_and_a_drained_pool_builds(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab
) -> None:
    await pool.fill()
    assert pool.counts() == {"free": 1, "in_use": 0, "on_demand": 0}
    # The pool is drained (its one slot taken, its refill not yet run): the second take builds.
    taken = [await pool.take(sandbox_id, INTERNET) for sandbox_id in ("one", "two")]
    assert pool.stats.built_on_demand == 1 and taken[0] != taken[1]
    for sandbox_id, made in zip(("one", "two"), taken, strict=True):
        await runtime.start(SandboxSpec(id=sandbox_id, memory_mb=128, netns=netns.netns_path(made)))
    assert await _probe(runtime, "one", netlab.ALLOWED) == f"open {netlab.ALLOWED}"
    slot = pool.slot_of("one")
    assert slot is not None
    assert _conntrack(slot.sandbox_ip)
    await runtime.stop("one")
    pool.size = 4  # room for it in the pool (the refill may have filled the one place meanwhile)
    await pool.give_back("one")
    # Nothing of it is left: no connection-tracking entry, a closed policy, no process inside.
    assert not _conntrack(slot.sandbox_ip)
    assert not netns.pids_inside(slot)
    listed = ["nft", "list", "chain", "inet", TABLE, slot.own("policy")]
    verdict = subprocess.run(listed, capture_output=True, text=True, check=True).stdout
    assert "reject" in verdict and "accept" not in verdict
    assert slot in pool.ready
    # The next sandbox in it starts with the new policy only.
    again = await pool.take("three", parse_policy({"deny_out": ["0.0.0.0/0"]}))
    assert again == slot
    await runtime.start(SandboxSpec(id="three", memory_mb=128, netns=netns.netns_path(again)))
    assert (await _probe(runtime, "three", netlab.ALLOWED)).startswith("closed")
    assert pool.stats.built_on_demand >= 1


def _conntrack(address: ipaddress.IPv4Address) -> bool:
    out = subprocess.run(["conntrack", "-L", "-s", str(address)], capture_output=True, text=True)
    return str(address) in out.stdout


def test_tools_are_installed() -> None:
    assert shutil.which("nft") and shutil.which("ip") and shutil.which("conntrack")


def test_rendered_tables_load() -> None:
    slot = slot_net(1)
    listed = parse_policy({"allow_out": ["198.51.100.0/24"], "deny_out": ["0.0.0.0/0"]})
    for policy in (NO_NETWORK, INTERNET, listed):
        text = render_table(slot, policy, [ipaddress.IPv4Network("10.98.0.0/24")])
        checked = subprocess.run(["nft", "-c", "-f", "-"], input=text, capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr


def _ruleset() -> list[dict[str, Any]]:
    out = subprocess.run(["nft", "-j", "list", "ruleset"], capture_output=True, text=True, check=True).stdout
    return [next(iter(item.values())) for item in json.loads(out)["nftables"] if "metainfo" not in item]


def test_slots_share_the_machines_hooks_and_leave_nothing_when_removed() -> None:
    # A range of the test's own, built without leases: no pool of this machine owns these indexes.
    made = [slot_net(i, ipaddress.IPv4Network("10.232.11.0/29")) for i in range(2)]
    try:
        for slot in made:
            netns.build(slot)
        # (Tables of other names may be anyone's on a shared machine: these slots' are looked for.)
        ours = (TABLE, *(f"corral_{s.tag}" for s in made))
        hooked = {(o["table"], o["name"]) for o in _ruleset() if "hook" in o and o["table"] in ours}
        assert hooked == {(TABLE, "to_host"), (TABLE, "through_host"), (TABLE, "masquerade_out")}
        # An earlier corral's table of a slot's own goes with the slot.
        netns.load(f"table inet corral_{made[0].tag} {{ }}\n")
    finally:
        for slot in made:
            netns.destroy(slot)
    left = [o for o in _ruleset() if any(s.tag in json.dumps(o) for s in made)]
    assert left == []


async def test_an_agent_gives_each_networked_sandbox_a_slot_and_takes_it_back(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from corral.agent.agent import Agent
    from corral.agent.config import AgentConfig
    from corral.agent.errors import AgentConflict, AgentInvalid
    from corral.agent.metrics import AgentCollector
    from corral.agent.protocol import EgressPolicyBody, ExecRequest, StartSandbox
    from corral.codes import ErrorCode

    agent = Agent(AgentConfig("net-host", 4096, 4.0), runtime, netslots=pool)
    online = EgressPolicyBody(mode="internet", deny_out=[str(netlab.DENIED)])
    await agent.start(StartSandbox(id="on", memory_mb=128, egress=online))
    await agent.start(StartSandbox(id="off", memory_mb=128))
    assert set(pool.in_use) == {"on"}  # mode none takes no slot: loopback only, as before slots
    assert await _probes(runtime, "on", [netlab.ALLOWED, netlab.DENIED], netlab.PORT) == [
        f"open {netlab.ALLOWED}",
        "closed OSError",
    ]
    links = await agent.exec("off", ExecRequest(command=["cat", "/proc/net/dev"]))
    assert "eth0" not in links.stdout
    # Hostnames cannot be held to their addresses by an IP filter: refused, nothing started.
    with pytest.raises(AgentInvalid) as caught:
        await agent.start(
            StartSandbox(id="named", memory_mb=128, egress=EgressPolicyBody(allow_out=["pypi.org"]))
        )
    assert caught.value.code == ErrorCode.NETWORK_HOSTNAMES_UNSUPPORTED
    assert "named" not in pool.in_use
    # A running sandbox's policy changes in place; one started without an interface cannot get one.
    await agent.set_egress("on", EgressPolicyBody(mode="internet", deny_out=["0.0.0.0/0"]))
    assert (await _probe(runtime, "on", netlab.ALLOWED)).startswith("closed")
    with pytest.raises(AgentConflict) as conflict:
        await agent.set_egress("off", EgressPolicyBody(mode="internet"))
    assert conflict.value.code == ErrorCode.NETWORK_NOT_ATTACHED
    registry = CollectorRegistry()
    registry.register(AgentCollector([agent]))
    text = generate_latest(registry).decode()
    assert 'corral_agent_network_slots{agent="net-host",state="in_use"} 1.0' in text
    await agent.stop("on")
    await agent.stop("off")
    assert not pool.in_use


def _exists(slot: SlotNet) -> bool:
    return Path("/run/netns", slot.netns).exists()


async def test_slots_left_by_a_killed_agent_or_a_removed_one_are_reclaimed_at_the_next_start(
    tmp_path: Path,
) -> None:
    # A range and a lease directory of this test's own: nothing it reclaims is anyone else's.
    own = {"lease_dir": tmp_path / "leases", "slot_range": ipaddress.IPv4Network("10.232.7.0/28")}
    killed = SlotPool(tmp_path / "a" / "netslots", size=2, **own)  # type: ignore[arg-type]
    await killed.fill()
    left = list(killed.ready)
    assert all(_exists(s) for s in left)
    # Another agent's pool, whose state was then removed (its agent gone for good).
    removed = SlotPool(tmp_path / "b" / "netslots", size=1, **own)  # type: ignore[arg-type]
    await removed.fill()
    assert [_exists(s) for s in removed.ready] == [True]
    shutil.rmtree(tmp_path / "b")
    # The first agent comes back on its own state (neither pool was closed: kill -9) and adopts
    # the one slot a sandbox still runs in.
    again = SlotPool(tmp_path / "a" / "netslots", size=1, **own)  # type: ignore[arg-type]
    assert again.adopt("survivor", netns.netns_path(left[0]))
    try:
        await again.fill()
        assert again.slot_of("survivor") == left[0]
        assert again.stats.destroyed == 2  # the killed pool's other ready slot, and the orphan
        # What is left on the host is what this pool holds: the survivor's and one ready slot (its
        # index may be one reclaimed above, built anew).
        held = {left[0].index, again.ready[0].index}
        assert {s.index for s in _all(own["slot_range"]) if _exists(s)} == held
        leases = {int(p.name) for p in (tmp_path / "leases").iterdir() if p.name.isdigit()}
        assert leases == held
    finally:
        await again.give_back("survivor")
        await again.close()
    assert not any(_exists(s) for s in _all(own["slot_range"]))


def _all(slot_range: object) -> list[SlotNet]:
    assert isinstance(slot_range, ipaddress.IPv4Network)
    return [slot_net(i, slot_range) for i in range(slot_count(slot_range))]


async def test_the_slots_of_state_being_removed_go_with_it_and_no_others(tmp_path: Path) -> None:
    own = {"lease_dir": tmp_path / "leases", "slot_range": ipaddress.IPv4Network("10.232.8.0/28")}
    doomed = SlotPool(tmp_path / "run" / "host-1" / "netslots", size=2, **own)  # type: ignore[arg-type]
    kept = SlotPool(tmp_path / "other" / "netslots", size=1, **own)  # type: ignore[arg-type]
    await doomed.fill()
    await kept.fill()
    try:
        assert reclaim_under(tmp_path / "run", **own) == 2  # type: ignore[arg-type]
        assert not any(_exists(s) for s in doomed.ready)
        assert [_exists(s) for s in kept.ready] == [True]
    finally:
        await kept.close()
        doomed.ready.clear()


async def test_a_pool_warms_at_its_first_networked_sandbox_and_not_before(tmp_path: Path) -> None:
    own = {"lease_dir": tmp_path / "leases", "slot_range": ipaddress.IPv4Network("10.232.9.0/28")}
    pool = SlotPool(tmp_path / "netslots", size=2, **own)  # type: ignore[arg-type]
    try:
        pool.refill()  # what an agent does at its start
        assert pool._filling is not None
        await pool._filling
        assert pool.counts() == {"free": 0, "in_use": 0, "on_demand": 0}
        assert not any(_exists(s) for s in _all(own["slot_range"]))
        await pool.take("first", NO_NETWORK)  # built on demand, then the pool warms behind it
        assert pool._filling is not None
        await pool._filling
        assert pool.counts() == {"free": 2, "in_use": 1, "on_demand": 1}
    finally:
        await pool.give_back("first")
        await pool.close()
    assert not any(_exists(s) for s in _all(own["slot_range"]))


async def test_a_slot_no_lease_accounts_for_is_removed_at_the_first_fill(tmp_path: Path) -> None:
    own = {"lease_dir": tmp_path / "leases", "slot_range": ipaddress.IPv4Network("10.232.10.0/28")}
    stray = slot_net(2, own["slot_range"])  # type: ignore[arg-type]
    netns.build(stray)  # its lease gone (or never written), the namespace, link and table left
    pool = SlotPool(tmp_path / "netslots", size=1, **own)  # type: ignore[arg-type]
    try:
        assert _exists(stray)
        await pool.fill()
        held = {s.index for s in pool.ready}
        assert {s.index for s in _all(own["slot_range"]) if _exists(s)} == held
        assert pool.stats.destroyed == 1  # the stray, reclaimed before anything was built
    finally:
        await pool.close()
        netns.destroy(stray)
    assert not any(_exists(s) for s in _all(own["slot_range"]))
