"""The slots' resolver with real sandboxes, against the lab's DNS server (corral.testing.netlab, a
namespace of the test's own): a name of allow_out resolves and connects though everything else is
denied, a name the policy does not allow is REFUSED and never reaches the upstream, DNS to any other
server is dropped by the slot's filter whatever the policy, and a sandbox flooding its resolver is
held to its own rate while another sandbox's names still resolve."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.agent import netns
from corral.agent.dns import MAX_STREAMS, SlotResolver
from corral.agent.netslots import SlotPool
from corral.core.netpolicy import INTERNET, TABLE, EgressPolicy, parse_policy
from corral.core.rates import Rate
from corral.runtime.process import ProcessRuntime
from corral.testing import netlab
from tests.runtime.slots import BOTH, emptied, lab, runtime, slot_runtime, started

__all__ = ["lab", "runtime", "slot_runtime"]

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(os.geteuid() != 0 or bool(netns.tools_missing()), reason="slots need root, ip, nft"),
]

_RANGE = ipaddress.IPv4Network("10.232.20.0/28")
_RATE = Rate(20.0, 20)

# ``resolve NAME``: the address getaddrinfo gives, or the error's class; ``ask SERVER NAME``: the
# rcode of one raw A query to SERVER:53 (standard library only: the sandbox's own python3), or the
# error's class; ``ask-tcp SERVER NAME``: the same over TCP, with the answer's last four bytes (its
# address, when it has one); ``flood SERVER NAME SECONDS``: queries sent without waiting for answers, how many.
_DNS = r"""
import socket, struct, sys, time

def query(name, qid=1):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">HH", 1, 1)

def ask(server, name):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.5)
    try:
        s.connect((server, 53))
        s.send(query(name))
        return "rcode %d" % (s.recv(4096)[3] & 0xF)
    except OSError as exc:
        return type(exc).__name__
    finally:
        s.close()

def exactly(s, n):
    # Not MSG_WAITALL: gVisor's host network refuses the flag.
    data = b""
    while len(data) < n and (chunk := s.recv(n - len(data))):
        data += chunk
    return data

def ask_tcp(server, name):
    try:
        with socket.create_connection((server, 53), timeout=1.5) as s:
            q = query(name)
            s.sendall(len(q).to_bytes(2, "big") + q)
            size = int.from_bytes(exactly(s, 2), "big")
            answer = exactly(s, size)
            return "rcode %d %s" % (answer[3] & 0xF, socket.inet_ntoa(answer[-4:]))
    except OSError as exc:
        return type(exc).__name__

def resolve(name):
    try:
        return socket.getaddrinfo(name, 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        return "gaierror"

def streams(server, name, n):
    held = [socket.create_connection((server, 53), timeout=3) for _ in range(int(n))]
    answered = 0
    for s in held:
        try:
            q = query(name)
            s.sendall(len(q).to_bytes(2, "big") + q)
            answered += len(exactly(s, 2)) == 2
        except OSError:
            pass
    return str(answered)

def flood(server, name, seconds):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    sent, end = 0, time.monotonic() + float(seconds)
    while time.monotonic() < end:
        try:
            s.sendto(query(name, sent % 65536), (server, 53))
            sent += 1
        except OSError:
            time.sleep(0.001)
    return str(sent)

verb, *args = sys.argv[1:]
verbs = {"ask": ask, "ask-tcp": ask_tcp, "resolve": resolve, "flood": flood, "streams": streams}
print(verbs[verb](*args))
"""


def _pool(tmp_path: Path, **resolver: object) -> SlotPool:
    return SlotPool(
        tmp_path / "netslots",
        size=0,
        lease_dir=tmp_path / "leases",
        slot_range=_RANGE,
        resolver=SlotResolver((str(netlab.DNS), 53), rate=_RATE, **resolver),  # type: ignore[arg-type]
    )


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[SlotPool]:
    async for ready in emptied(_pool(tmp_path, in_flight=4)):
        yield ready


async def _sandbox(runtime: ProcessRuntime, pool: SlotPool, sandbox_id: str, policy: EgressPolicy) -> str:
    return str((await started(runtime, pool, sandbox_id, policy)).host_ip)


async def _dns(runtime: ProcessRuntime, sandbox_id: str, *args: object) -> str:
    result = await runtime.exec(sandbox_id, ["python3", "-c", _DNS, *map(str, args)], timeout_s=30)
    assert result.exit_code == 0, result.stderr
    return result.stdout.strip()


async def _get(runtime: ProcessRuntime, sandbox_id: str, host: str) -> str:
    argv = ["python3", "-c", _GET, f"http://{host}:{netlab.PORT}/"]
    result = await runtime.exec(sandbox_id, argv, timeout_s=30)
    return result.stdout.strip()


_GET = """
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())
except OSError as exc:
    print("closed", type(exc).__name__)
"""


def _resolved(pool: SlotPool, sandbox_id: str) -> str:
    slot = pool.slot_of(sandbox_id)
    assert slot is not None
    listed = ["nft", "list", "set", "inet", TABLE, slot.own("resolved")]
    return subprocess.run(listed, capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("slot_runtime", BOTH, indirect=True)
async def test_a_name_resolves_as_the_policy_says_and_no_other_resolver_is_reachable(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab
) -> None:
    listed = parse_policy({"allow_out": ["allowed.lab"], "deny_out": ["0.0.0.0/0"]})
    gateway = await _sandbox(runtime, pool, "listed", listed)
    # The allowed name: its address answered, then reachable though 0.0.0.0/0 is denied.
    assert str(netlab.ALLOWED) not in _resolved(pool, "listed")
    assert await _dns(runtime, "listed", "resolve", "allowed.lab") == str(netlab.ALLOWED)
    assert str(netlab.ALLOWED) in _resolved(pool, "listed")
    assert await _get(runtime, "listed", "allowed.lab") == str(netlab.ALLOWED)
    # Over TCP too (how a client retries a truncated answer), asked upstream over TCP.
    tcp = await _dns(runtime, "listed", "ask-tcp", gateway, "allowed.lab")
    assert tcp == f"rcode 0 {netlab.ALLOWED}"
    assert (await _dns(runtime, "listed", "ask-tcp", gateway, "denied.lab")).startswith("rcode 5")
    # Another name: REFUSED (rcode 5) by the slot's resolver, never asked upstream; its address
    # stays out of reach by number too.
    before = lab.dns_queries()
    assert await _dns(runtime, "listed", "ask", gateway, "denied.lab") == "rcode 5"
    assert await _dns(runtime, "listed", "resolve", "denied.lab") == "gaierror"
    assert lab.dns_queries() == before
    assert (await _get(runtime, "listed", str(netlab.DENIED))).startswith("closed")

    # Full internet: any name is forwarded and answered, and the lab's DNS server's address is
    # reachable on other ports; but DNS to it directly is dropped by the filter, whatever the policy.
    open_gateway = await _sandbox(runtime, pool, "open", INTERNET)
    assert await _dns(runtime, "open", "ask", open_gateway, "denied.lab") == "rcode 0"
    assert await _dns(runtime, "open", "resolve", "denied.lab") == str(netlab.DENIED)
    assert await _get(runtime, "open", str(netlab.DNS)) == str(netlab.DNS)
    before = lab.dns_queries()
    for sandbox_id in ("open", "listed"):
        assert await _dns(runtime, sandbox_id, "ask", netlab.DNS, "allowed.lab") != "rcode 0"
        assert not (await _dns(runtime, sandbox_id, "ask-tcp", netlab.DNS, "allowed.lab")).startswith("rcode")
        # Nor another slot's resolver: the other sandbox's gateway is a host address like any.
        other = gateway if sandbox_id == "open" else open_gateway
        assert await _dns(runtime, sandbox_id, "ask", other, "allowed.lab") != "rcode 0"
    assert lab.dns_queries() == before

    # A change of policy: the name no longer allowed is refused and its address is unreachable.
    await pool.apply("listed", parse_policy({"deny_out": ["0.0.0.0/0"]}))
    assert str(netlab.ALLOWED) not in _resolved(pool, "listed")
    assert await _dns(runtime, "listed", "ask", gateway, "allowed.lab") == "rcode 5"
    assert (await _get(runtime, "listed", str(netlab.ALLOWED))).startswith("closed")


async def test_a_query_flood_is_held_to_its_own_sandbox(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab
) -> None:
    listed = parse_policy({"allow_out": ["allowed.lab"], "deny_out": ["0.0.0.0/0"]})
    flooder = await _sandbox(runtime, pool, "flood", listed)
    await _sandbox(runtime, pool, "calm", listed)
    before = lab.dns_queries()
    started = time.monotonic()
    flood = asyncio.ensure_future(_dns(runtime, "flood", "flood", flooder, "allowed.lab", 2))
    await asyncio.sleep(0.5)  # the flood under way
    # The other sandbox's names resolve all along, and it reaches what they name.
    for _ in range(3):
        assert await _dns(runtime, "calm", "resolve", "allowed.lab") == str(netlab.ALLOWED)
    assert await _get(runtime, "calm", "allowed.lab") == str(netlab.ALLOWED)
    sent = int(await flood)
    await asyncio.sleep(0.2)  # what the flooder's socket still held, read
    upstream = lab.dns_queries() - before
    elapsed = time.monotonic() - started
    assert pool.resolver is not None
    calm, flooded = (pool.slot_of(sandbox_id) for sandbox_id in ("calm", "flood"))
    assert calm is not None and flooded is not None
    # Thousands sent; what reached the upstream from the flooder is what its own bucket allows
    # (a burst of 20, then 20 a second), the rest dropped at the resolver or in the kernel's queue.
    assert sent > 1000, sent
    assert pool.resolver.stats(flooded).dropped > 0
    forwarded = upstream - pool.resolver.stats(calm).answered
    assert forwarded <= _RATE.burst + _RATE.rate_per_s * elapsed, (forwarded, sent, elapsed)
    # Connections held open: four are served at once, the others closed unanswered.
    assert await _dns(runtime, "calm", "streams", calm.host_ip, "allowed.lab", 10) == str(MAX_STREAMS)


async def test_an_agent_names_the_resolver_and_a_restarted_one_answers_as_before(
    runtime: ProcessRuntime, pool: SlotPool, lab: netlab.Lab, tmp_path: Path
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from corral.agent.agent import Agent
    from corral.agent.config import AgentConfig
    from corral.agent.metrics import AgentCollector
    from corral.agent.protocol import EgressPolicyBody, StartSandbox

    agent = Agent(AgentConfig("dns-host", 4096, 4.0), runtime, netslots=pool)
    egress = EgressPolicyBody(mode="internet", allow_out=["allowed.lab"], deny_out=["0.0.0.0/0"])
    await agent.start(StartSandbox(id="named", memory_mb=128, egress=egress))
    conf = await runtime.exec("named", ["cat", "/etc/resolv.conf"])
    slot = pool.slot_of("named")
    assert slot is not None and f"nameserver {slot.host_ip}" in conf.stdout
    assert await _dns(runtime, "named", "resolve", "allowed.lab") == str(netlab.ALLOWED)
    # The agent is killed (its resolver's socket goes with its process; the sandbox runs on), and
    # a new one adopts the sandbox: names resolve as its policy said, and no others.
    assert pool.resolver is not None
    pool.resolver.close(slot)
    del pool.in_use["named"]
    again = _pool(tmp_path)
    try:
        restarted = Agent(AgentConfig("dns-host", 4096, 4.0), runtime, netslots=again)
        assert await restarted.adopt() == 1
        await asyncio.gather(*again._adopting)
        assert await _dns(runtime, "named", "resolve", "allowed.lab") == str(netlab.ALLOWED)
        assert await _dns(runtime, "named", "ask", str(slot.host_ip), "denied.lab") == "rcode 5"
        registry = CollectorRegistry()
        registry.register(AgentCollector([restarted]))
        text = generate_latest(registry).decode()
        for outcome, n in (("answered", 1), ("refused", 1), ("dropped", 0)):
            assert f'corral_agent_dns_queries_total{{agent="dns-host",outcome="{outcome}"}} {n}.0' in text
        await restarted.stop("named")
        assert not again.in_use
    finally:
        for sandbox_id in list(again.in_use):
            await again.give_back(sandbox_id)
        await again.close()
