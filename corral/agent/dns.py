"""The resolver of a host's network slots: one UDP socket on each slot's host-side address, port 53,
which the slot's sandbox has as its only nameserver (its ``/etc/resolv.conf``; the slot's chains
drop DNS to any other address). A query is answered as the slot's policy says
(:func:`corral.core.netpolicy.dns_verdict`): forwarded to the agent's upstream, or REFUSED (never
NXDOMAIN: the name may well exist; the policy is what refuses it) without leaving the host. The
addresses answered for a name of ``allow_out`` enter the slot's ``resolved`` set before the answer
reaches the sandbox, so its first connection to them passes.

Bounded per slot, so a sandbox that floods it harms only itself: a token bucket (queries past it are
dropped unread of anything but their source), a bound on its queries in flight upstream (past it,
dropped), and the socket's own receive buffer as the queue (the kernel drops what overflows it).
A TCP connection (a client retrying a truncated answer) is served the same way, its queries one
after another, asked upstream over TCP; at most four per sandbox, closed when idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field

from dnslib import QTYPE, RCODE, DNSError, DNSHeader, DNSQuestion, DNSRecord

from corral.agent import netns
from corral.core.netpolicy import DNS_PORT, NO_NETWORK, EgressPolicy, SlotNet, dns_verdict, resolved_elements
from corral.core.rates import Rate, TokenBucket

log = logging.getLogger("corral.agent.dns")

DEFAULT_RATE = Rate(100.0, 200)  # queries a second per sandbox, and its burst
DEFAULT_IN_FLIGHT = 32  # queries of one sandbox awaiting the upstream at once
MAX_STREAMS = 4  # TCP connections of one sandbox at once
STREAM_IDLE_S = 10.0
UPSTREAM_TIMEOUT_S = 3.0
_MAX_QUERY = 512  # a query without EDNS fits; a larger datagram is no query of ours to forward


_Ask = Callable[[tuple[str, int], bytes], Awaitable[bytes]]


@dataclass
class ResolverStats:
    answered: int = 0
    refused: int = 0
    dropped: int = 0  # over the rate or the bound in flight, malformed, or from a foreign source
    failed: int = 0  # the upstream did not answer, or the set could not be updated (SERVFAIL)


@dataclass
class _Slot:
    slot: SlotNet
    transport: asyncio.DatagramTransport
    policy: EgressPolicy
    bucket: TokenBucket
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # set updates against policy changes
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # its datagrams' answers
    streams: set[asyncio.StreamWriter] = field(default_factory=set)  # its TCP connections
    server: asyncio.Server | None = None
    pending: int = 0  # its queries awaiting the upstream
    stats: ResolverStats = field(default_factory=ResolverStats)


def upstream_of(text: str) -> tuple[str, int]:
    """``ADDRESS`` or ``ADDRESS:PORT`` (IPv4) as an upstream; ValueError when it is neither."""
    address, _, port = text.partition(":")
    ipaddress.IPv4Address(address)
    number = int(port) if port else DNS_PORT
    if not 0 < number < 65536:
        raise ValueError(f"port {number} is out of range")
    return address, number


def host_upstream(path: str = "/etc/resolv.conf") -> tuple[str, int] | None:
    """The host's own first IPv4 nameserver (the default upstream), or None."""
    with contextlib.suppress(OSError), open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                with contextlib.suppress(ValueError):
                    return upstream_of(parts[1])
    return None


@dataclass(eq=False)
class SlotResolver:
    upstream: tuple[str, int]
    _: KW_ONLY
    rate: Rate = DEFAULT_RATE
    in_flight: int = DEFAULT_IN_FLIGHT
    timeout_s: float = UPSTREAM_TIMEOUT_S
    _slots: dict[int, _Slot] = field(default_factory=dict, init=False, repr=False)
    # Every slot's, since the agent started (its metrics).
    totals: ResolverStats = field(default_factory=ResolverStats, init=False)

    def stats(self, slot: SlotNet) -> ResolverStats:
        return self._slots[slot.index].stats

    def _count(self, entry: _Slot, outcome: str) -> None:
        for stats in (entry.stats, self.totals):
            setattr(stats, outcome, getattr(stats, outcome) + 1)

    async def open(self, slot: SlotNet) -> None:
        """Listen for ``slot``'s sandbox (refusing every name until a policy is set)."""
        if slot.index in self._slots:
            return
        loop = asyncio.get_running_loop()
        holder: list[_Slot] = []
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Listener(self, holder), local_addr=(str(slot.host_ip), DNS_PORT)
        )
        entry = _Slot(slot, transport, NO_NETWORK, TokenBucket(self.rate, time.monotonic()))
        holder.append(entry)
        try:
            entry.server = await asyncio.start_server(
                lambda r, w: self._stream(entry, r, w), str(slot.host_ip), DNS_PORT
            )
        except BaseException:
            transport.close()
            raise
        self._slots[slot.index] = entry

    @contextlib.asynccontextmanager
    async def changing(self, slot: SlotNet, policy: EgressPolicy) -> AsyncIterator[None]:
        """Around a change of ``slot``'s policy in its chains: answers from then on follow ``policy``,
        and no address resolved under the old one is added once the new one is in force."""
        await self.open(slot)
        entry = self._slots[slot.index]
        async with entry.lock:
            old, entry.policy = entry.policy, policy
            try:
                yield
            except BaseException:
                entry.policy = old  # the chains kept the old policy: so do the answers
                raise

    def release(self, slot: SlotNet) -> None:
        """``slot``'s sandbox is gone: what it asked and was owed goes with it."""
        entry = self._slots.get(slot.index)
        if entry is None:
            return
        for task in entry.tasks:
            task.cancel()
        for writer in entry.streams:
            writer.close()
        entry.policy = NO_NETWORK
        entry.bucket = TokenBucket(self.rate, time.monotonic())
        entry.stats = ResolverStats()

    def close(self, slot: SlotNet) -> None:
        self.release(slot)
        entry = self._slots.pop(slot.index, None)
        if entry is not None:
            entry.transport.close()
            if entry.server is not None:
                entry.server.close()

    # -- one query -----------------------------------------------------------------------------------

    def received(self, entry: _Slot, data: bytes, source: tuple[str, int]) -> None:
        """A datagram on ``entry``'s socket: answered from a task of its own, or dropped."""
        if source[0] != str(entry.slot.sandbox_ip):
            self._count(entry, "dropped")
            return
        query = self._admit(entry, data)
        if query is not None:
            task = asyncio.get_running_loop().create_task(self._datagram(entry, query, data, source))
            entry.tasks.add(task)
            task.add_done_callback(entry.tasks.discard)

    async def _datagram(self, entry: _Slot, query: DNSRecord, data: bytes, source: tuple[str, int]) -> None:
        entry.transport.sendto(await self._answer(entry, query, _ask), source)

    async def _stream(self, entry: _Slot, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """A TCP connection to ``entry``'s resolver (what a client does with a truncated answer): its
        queries one after another, each bounded as a datagram is, until it goes idle."""
        peer = writer.get_extra_info("peername")
        if not peer or peer[0] != str(entry.slot.sandbox_ip) or len(entry.streams) >= MAX_STREAMS:
            self._count(entry, "dropped")
            writer.close()
            return
        entry.streams.add(writer)
        try:
            while True:
                size = int.from_bytes(await asyncio.wait_for(reader.readexactly(2), STREAM_IDLE_S), "big")
                data = await asyncio.wait_for(reader.readexactly(size), STREAM_IDLE_S)
                query = self._admit(entry, data)
                if query is not None:
                    answer = await self._answer(entry, query, _ask_stream)
                    writer.write(len(answer).to_bytes(2, "big") + answer)
                    await asyncio.wait_for(writer.drain(), STREAM_IDLE_S)  # a reader that stops
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            entry.streams.discard(writer)
            writer.close()

    def _admit(self, entry: _Slot, data: bytes) -> DNSRecord | None:
        """The query ``data`` holds, if ``entry``'s bounds admit it; None (dropped) if not."""
        over = entry.bucket.take(time.monotonic()) is not None or entry.pending >= self.in_flight
        try:
            query = None if over or len(data) > _MAX_QUERY else DNSRecord.parse(data)
        except (DNSError, ValueError, IndexError):
            query = None
        if query is None or len(query.questions) != 1 or query.header.qr:
            self._count(entry, "dropped")
            return None
        return query

    async def _answer(self, entry: _Slot, query: DNSRecord, ask: _Ask) -> bytes:
        """The answer to ``query`` as ``entry``'s policy says: REFUSED, or the upstream's (asked by
        ``ask``), its addresses made reachable first for an allowed name; SERVFAIL on failure."""
        policy = entry.policy
        if dns_verdict(policy, str(query.q.qname)) == "refuse":
            self._count(entry, "refused")
            return _reply(query, RCODE.REFUSED)
        entry.pending += 1
        try:
            answer = await asyncio.wait_for(ask(self.upstream, _forwarded(query)), self.timeout_s)
            parsed = DNSRecord.parse(answer)
            if parsed.header.id != query.header.id or parsed.q != query.q:
                raise DNSError("the upstream answered another question")
            if dns_verdict(policy, str(query.q.qname)) == "allow":
                answer = await self._allow(entry, query, parsed, answer)
        except (TimeoutError, OSError, DNSError, ValueError, IndexError, netns.SlotCommandFailed) as exc:
            log.debug("slot %s: %s not resolved: %s", entry.slot.netns, query.q.qname, exc)
            self._count(entry, "failed")
            return _reply(query, RCODE.SERVFAIL)
        finally:
            entry.pending -= 1
        self._count(entry, "answered")
        return answer

    async def _allow(self, entry: _Slot, query: DNSRecord, parsed: DNSRecord, answer: bytes) -> bytes:
        """Make the addresses answered reachable, then give the answer; REFUSED when the policy
        changed meanwhile and no longer allows the name."""
        addresses = [ipaddress.IPv4Address(str(rr.rdata)) for rr in parsed.rr if rr.rtype == QTYPE.A]
        async with entry.lock:
            if dns_verdict(entry.policy, str(query.q.qname)) != "allow":
                return _reply(query, RCODE.REFUSED)
            if addresses:
                ttl = min(rr.ttl for rr in parsed.rr if rr.rtype == QTYPE.A)
                await asyncio.to_thread(netns.load, resolved_elements(entry.slot, addresses, ttl))
        return answer


class _Listener(asyncio.DatagramProtocol):
    def __init__(self, resolver: SlotResolver, holder: list[_Slot]) -> None:
        self.resolver = resolver
        self.holder = holder

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if self.holder:
            self.resolver.received(self.holder[0], data, addr)


def _forwarded(query: DNSRecord) -> bytes:
    """The query as the upstream gets it: its one question and id, rebuilt here, so nothing else the
    sandbox put in its message (extra sections, EDNS options, flags) reaches the host's resolver."""
    q = query.q
    packed: bytes = DNSRecord(
        DNSHeader(id=query.header.id, rd=1), q=DNSQuestion(q.qname, q.qtype, q.qclass)
    ).pack()
    return packed


def _reply(query: DNSRecord, rcode: int) -> bytes:
    reply = query.reply()
    reply.header.rcode = rcode
    packed: bytes = reply.pack()
    return packed


class _Answer(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.future: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        if not self.future.done():
            self.future.set_result(data)

    def error_received(self, exc: Exception) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


async def _ask_stream(upstream: tuple[str, int], data: bytes) -> bytes:
    """One query to the upstream over TCP (for a query that came over TCP: its answer may be long)."""
    reader, writer = await asyncio.open_connection(*upstream)
    try:
        writer.write(len(data).to_bytes(2, "big") + data)
        await writer.drain()
        size = int.from_bytes(await reader.readexactly(2), "big")
        return await reader.readexactly(size)
    finally:
        writer.close()


async def _ask(upstream: tuple[str, int], data: bytes) -> bytes:
    """One query to the upstream from a socket of its own (a random source port, answers from
    the upstream only: a connected socket takes nothing from anyone else)."""
    transport, protocol = await asyncio.get_running_loop().create_datagram_endpoint(
        _Answer, remote_addr=upstream
    )
    try:
        transport.sendto(data)
        return await protocol.future
    finally:
        transport.close()
