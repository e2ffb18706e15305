"""An agent's network slots: a pool of ready ones (:mod:`corral.agent.netns` builds them), one
taken per sandbox whose policy needs an interface, scrubbed and returned when it is gone.

The pool's depth is a warm-start optimisation, not a bound: a drained pool builds a slot on demand
(tens of milliseconds) and never refuses. What bounds slots is the machine's slot range (16,384 in
the default /16), shared by every agent on the machine through leases in one directory (the same
lease files and lock as sandbox uids, :class:`corral.runtime.uids.UidAllocator`): two agents on one
machine never hold the same index, hence never the same names or addresses.

A pool starts empty and warms at its host's first networked sandbox: a host whose sandboxes never ask
for an interface (the default policy asks for none) keeps no slot. Each slot is a namespace, a veth
pair, chains in the machine's table and a mount on the host, and every sandbox start reads the
mount table: 24 slots built ahead at a 12-host ``corral serve``'s start doubled the p99 of its first
burst of 50 creates.

Everything of a slot is made when it is built (namespace, link, chains with their fixed sets, the
resolver's socket, :mod:`corral.agent.dns`); a take only puts its sandbox's policy in force (a
transaction of a few set and chain operations, :func:`corral.core.netpolicy.render_policy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.agent import netns
from corral.agent.dns import SlotResolver, host_upstream
from corral.core.netpolicy import (
    DEFAULT_SLOT_RANGE,
    EgressPolicy,
    PolicyError,
    SlotNet,
    parse_policy,
    render_policy,
    slot_count,
    slot_net,
)
from corral.runtime.base import Runtime
from corral.runtime.uids import Lease, UidAllocator, UidsExhausted

log = logging.getLogger("corral.agent.netslots")

DEFAULT_LEASE_DIR = Path("/run/corral/netslots")
DEFAULT_POOL_SIZE = 4
# The lease's owner directory under the pool's state: a lease whose owner directory is gone (its
# agent's state removed) is stale and reclaimed by the next pool that meets it.
_OWNER = "slots"


class SlotsUnavailable(Exception):
    """No slot could be had: the machine's range is used up, or building one failed."""


@dataclass
class SlotStats:
    built_ahead: int = 0
    built_on_demand: int = 0
    scrubbed: int = 0
    destroyed: int = 0
    failures: int = 0


class SlotPool:
    """``size`` ready slots kept ahead of demand; ``operator_allow``: private ranges the operator
    lets policies reach (see :func:`corral.core.netpolicy.render_table`), fixed when a slot is built."""

    def __init__(
        self,
        state_dir: Path,
        *,
        size: int = 4,
        lease_dir: Path = DEFAULT_LEASE_DIR,
        slot_range: ipaddress.IPv4Network = DEFAULT_SLOT_RANGE,
        operator_allow: Sequence[ipaddress.IPv4Network] = (),
        resolver: SlotResolver | None = None,
    ) -> None:
        if size < 0:
            raise ValueError("the slot pool size must not be negative")
        self.size = size
        self.slot_range = slot_range
        self.operator_allow = tuple(operator_allow)
        # The slots' resolver (None: no names answered, and policies naming hosts are refused).
        self.resolver = resolver
        (state_dir / _OWNER).mkdir(parents=True, exist_ok=True)
        # The policy each slot in use enforces, for the resolver of an agent restarted under it.
        self._policies = state_dir / "policies"
        self._policies.mkdir(exist_ok=True)
        self._leases = UidAllocator(lease_dir, range(slot_count(slot_range)), state_dir)
        self.ready: list[SlotNet] = []
        self.in_use: dict[str, SlotNet] = {}
        self.stats = SlotStats()
        self._filling: asyncio.Task[None] | None = None
        # Every index this pool holds a lease for (built, building, in use or adopted); a lease of
        # its root outside it is from an earlier life. Taking a lease and noting it are one step
        # to a reclaim (``_leasing``).
        self._leased: set[int] = set()
        self._leasing = threading.Lock()
        self._reclaimed = False
        self._wanted = False  # a slot has been asked for: from then on, keep ``size`` ready
        self._adopting: set[asyncio.Task[None]] = set()

    # -- taking and returning --------------------------------------------------------------------

    async def take(self, sandbox_id: str, policy: EgressPolicy) -> SlotNet:
        """A slot for ``sandbox_id`` enforcing ``policy``: a ready one, or one built now."""
        if sandbox_id in self.in_use:
            raise SlotsUnavailable(f"sandbox {sandbox_id!r} already holds a slot")
        self._wanted = True
        if self.ready:
            slot = self.ready.pop()
        else:
            slot = await self._build()
            self.stats.built_on_demand += 1
        self.in_use[sandbox_id] = slot
        try:
            await self.apply(sandbox_id, policy)
        except BaseException:
            self.in_use.pop(sandbox_id, None)
            await asyncio.shield(self._retire(slot))
            raise
        self.refill()
        return slot

    async def apply(self, sandbox_id: str, policy: EgressPolicy) -> None:
        """Replace ``sandbox_id``'s policy in one transaction (a running sandbox's included): its lists
        and verdict only, on the chains its slot was built with, so a take costs a fraction of a
        millisecond (the chains, the fixed sets and the operator's list are all made at build time)."""
        slot = self.in_use[sandbox_id]
        if self.resolver is None:
            await _load(render_policy(slot, policy), policy)
            return
        async with self.resolver.changing(slot, policy):
            await _load(render_policy(slot, policy), policy)
            (self._policies / str(slot.index)).write_text(json.dumps(policy.to_dict()))

    def slot_of(self, sandbox_id: str) -> SlotNet | None:
        return self.in_use.get(sandbox_id)

    async def give_back(self, sandbox_id: str) -> None:
        """Scrub ``sandbox_id``'s slot (its processes must be gone) and keep it ready, or remove it
        when the pool is full or the scrub fails. Nothing to do for a sandbox without one."""
        slot = self.in_use.pop(sandbox_id, None)
        if slot is None:
            return
        if self.resolver is not None:
            self.resolver.release(slot)
            (self._policies / str(slot.index)).unlink(missing_ok=True)
        if len(self.ready) < self.size:
            try:
                await asyncio.to_thread(netns.scrub, slot)
            except (netns.SlotCommandFailed, OSError) as exc:
                log.warning("slot %s not reused: %s", slot.netns, exc)
                self.stats.failures += 1
            else:
                self.stats.scrubbed += 1
                self.ready.append(slot)
                return
        await self._retire(slot)

    def adopt(self, sandbox_id: str, netns_path: str) -> bool:
        """Account for the slot a sandbox still runs in (after the agent restarted)."""
        name = Path(netns_path).name
        try:
            address = int(name.removeprefix("corral-"), 16)
            slot = slot_net((address - int(self.slot_range.network_address) - 2) // 4, self.slot_range)
        except ValueError:
            return False
        if slot.netns != name:
            return False
        with self._leasing:
            self._leased.add(slot.index)
        self.in_use[sandbox_id] = slot
        if self.resolver is not None:
            self._serve_adopted(slot)
        return True

    def _serve_adopted(self, slot: SlotNet) -> None:
        """The resolver answers an adopted slot's sandbox as before the restart (its chains kept it)."""
        try:
            policy = parse_policy(json.loads((self._policies / str(slot.index)).read_text()))
        except (OSError, ValueError, PolicyError) as exc:
            log.warning("slot %s: no names answered until its policy is set again: %s", slot.netns, exc)
            return
        assert self.resolver is not None
        task = asyncio.get_running_loop().create_task(self._answer(slot, policy))
        self._adopting.add(task)
        task.add_done_callback(self._adopting.discard)

    async def _answer(self, slot: SlotNet, policy: EgressPolicy) -> None:
        assert self.resolver is not None
        async with self.resolver.changing(slot, policy):
            pass

    # -- building ahead ----------------------------------------------------------------------------

    def refill(self) -> None:
        """In the background (one filler at a time): the first time, take back what no pool will
        (:meth:`reclaim`); once a slot has been taken, build up to ``size`` ready ones."""
        wanted = self._wanted and len(self.ready) < self.size
        if (self._reclaimed and not wanted) or (self._filling is not None and not self._filling.done()):
            return
        self._filling = asyncio.get_running_loop().create_task(self._refill(), name="netslots-fill")

    async def _refill(self) -> None:
        await (self.fill() if self._wanted else self._reclaim_once())

    async def _reclaim_once(self) -> None:
        if not self._reclaimed:
            self._reclaimed = True
            await asyncio.to_thread(self.reclaim)

    async def fill(self) -> None:
        """Build up to ``size`` ready slots now (reclaiming first, the first time)."""
        self._wanted = True
        await self._reclaim_once()
        while len(self.ready) < self.size:
            try:
                slot = await self._build()
            except SlotsUnavailable as exc:
                log.warning("slot pool not filled: %s", exc)
                return
            self.stats.built_ahead += 1
            self.ready.append(slot)

    def reclaim(self) -> int:
        """Remove the slots of this machine that no pool will ever give back: those of a pool whose
        state is gone, and this pool's own from an earlier life (its agent killed before it closed
        the pool) that no adopted sandbox runs in. Run once, by the first fill, after adoption: an
        agent that crashes leaks its slots only until it, or any agent of the machine, starts again.
        Every slot stays a mount and chains on the host until then, and each mount is a line that
        every sandbox start reads (bubblewrap parses the mount table)."""
        mine = self._leases.statedir_root

        def keep(lease: Lease) -> bool:
            if lease.root == mine:
                return lease.uid in self._leased
            return lease.owner_exists()

        with self._leasing:
            taken = self._leases.reclaim(keep, lambda index: netns.destroy(slot_net(index, self.slot_range)))
            taken += self._leases.under_lock(self._unleased)
        if taken:
            log.info("reclaimed %d network slots left by agents that are gone", len(taken))
        self.stats.destroyed += len(taken)
        return len(taken)

    def _unleased(self) -> list[int]:
        """Remove the namespaces of this pool's range that no lease accounts for (their lease went,
        the slot did not: an agent killed between the two, or an older corral's reclaim)."""
        gone = []
        for index in _namespaces_in(self.slot_range):
            if not (self._leases.directory / str(index)).exists():
                netns.destroy(slot_net(index, self.slot_range))
                gone.append(index)
        return gone

    async def _build(self) -> SlotNet:
        try:
            index = await asyncio.to_thread(self._acquire)
        except UidsExhausted:
            raise SlotsUnavailable(f"every slot of {self.slot_range} on this machine is in use") from None
        slot = slot_net(index, self.slot_range)
        try:
            await asyncio.to_thread(netns.build, slot, self.operator_allow)
            if self.resolver is not None:
                await self.resolver.open(slot)  # its socket made now, not at the take
        except BaseException as exc:
            self.stats.failures += 1
            await asyncio.shield(self._retire(slot))
            if isinstance(exc, netns.SlotCommandFailed | OSError):
                raise SlotsUnavailable(f"slot {slot.netns} could not be built: {exc}") from exc
            raise
        return slot

    def _acquire(self) -> int:
        with self._leasing:
            index = self._leases.acquire(_OWNER)
            self._leased.add(index)
        return index

    async def _retire(self, slot: SlotNet) -> None:
        if self.resolver is not None:
            self.resolver.close(slot)
        await asyncio.to_thread(netns.destroy, slot)
        await asyncio.to_thread(self._leases.release, slot.index, _OWNER)
        self._leased.discard(slot.index)
        self.stats.destroyed += 1

    async def close(self) -> None:
        """Remove the ready slots (those in use stay with their sandboxes)."""
        if self._filling is not None:
            self._filling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._filling
        while self.ready:
            await self._retire(self.ready.pop())

    def counts(self) -> dict[str, int]:
        return {"free": len(self.ready), "in_use": len(self.in_use), "on_demand": self.stats.built_on_demand}


# A policy of up to this many listed entries loads in well under a millisecond (0.2-0.4 ms
# measured), less than handing it to a thread and back costs on a busy host: it runs on the loop,
# unless another thread's transaction holds nftables (the loop never waits on a thread).
_INLINE_ENTRIES = 64


async def _load(text: str, policy: EgressPolicy) -> None:
    if len(policy.allow_out) + len(policy.deny_out) <= _INLINE_ENTRIES and netns.load_if_free(text):
        return
    await asyncio.to_thread(netns.load, text)


def pool_for(
    runtime: Runtime,
    runtime_root: Path,
    size: int = DEFAULT_POOL_SIZE,
    dns_upstream: tuple[str, int] | None = None,
) -> SlotPool | None:
    """The slot pool an agent running ``runtime`` (its state under ``runtime_root``) gets: one for the
    process or gvisor runtime run as root where iproute2, nftables and conntrack are installed, else None (such
    a host refuses creates whose policy needs an interface, so they are placed elsewhere). Its
    resolver forwards to ``dns_upstream``, by default the host's own nameserver."""
    if runtime.name not in ("process", "gvisor") or os.geteuid() != 0:
        return None
    missing = netns.tools_missing()
    if missing:
        log.warning("no network slots on this host: %s missing (make system-deps)", ", ".join(missing))
        return None
    upstream = dns_upstream or host_upstream()
    resolver = None if upstream is None else SlotResolver(upstream)
    return SlotPool(runtime_root.with_name(runtime_root.name + ".netslots"), size=size, resolver=resolver)


def _namespaces_in(slot_range: ipaddress.IPv4Network) -> list[int]:
    """The indexes of the slots of ``slot_range`` whose namespace exists on this machine."""
    try:
        names = os.listdir(netns.NETNS_DIR)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        tag = name.removeprefix("corral-")
        if tag == name or len(tag) != 8:
            continue
        try:
            address = ipaddress.IPv4Address(int(tag, 16))
        except ValueError:
            continue
        if address in slot_range:
            index = (int(address) - int(slot_range.network_address)) // 4
            if slot_net(index, slot_range).netns == name:
                found.append(index)
    return found


def reclaim_under(
    root: Path, *, lease_dir: Path = DEFAULT_LEASE_DIR, slot_range: ipaddress.IPv4Network = DEFAULT_SLOT_RANGE
) -> int:
    """Remove every slot leased by a pool whose state lies under ``root``, whoever runs it: for state
    that is being removed while its agents cannot close their pools (killed, or a test run's
    temporary directories, which outlive the run). Returns how many went."""
    if not lease_dir.is_dir():
        return 0
    under = str(root.resolve())
    leases = UidAllocator(lease_dir, range(slot_count(slot_range)), root)
    taken = leases.reclaim(
        lambda lease: not (lease.root == under or lease.root.startswith(under + os.sep)),
        lambda index: netns.destroy(slot_net(index, slot_range)),
    )
    return len(taken)
