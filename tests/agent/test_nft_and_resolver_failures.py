"""What the slot machinery does when a step fails or is busy: a refused policy change leaves the
resolver answering by the policy still in force, and a loop never waits on another thread's
nftables transaction."""

from __future__ import annotations

import ipaddress

import pytest

from corral.agent import nftlib
from corral.agent.dns import SlotResolver
from corral.core.netpolicy import INTERNET, NO_NETWORK, SlotNet


async def test_a_policy_change_that_fails_leaves_the_old_policy_answering() -> None:
    slot = SlotNet(
        index=1,
        host_ip=ipaddress.IPv4Address("127.0.0.77"),
        sandbox_ip=ipaddress.IPv4Address("127.0.0.78"),
        slot_range=ipaddress.IPv4Network("127.0.0.76/30"),
    )
    resolver = SlotResolver(("127.0.0.1", 9))
    try:
        async with resolver.changing(slot, NO_NETWORK):
            pass
        with pytest.raises(RuntimeError):
            async with resolver.changing(slot, INTERNET):
                raise RuntimeError("the table refused the new policy")
        # The table still holds the old policy, so the answers follow it, not the refused one.
        assert resolver._slots[slot.index].policy == NO_NETWORK
    finally:
        resolver.release(slot)


def test_a_transaction_held_by_another_thread_is_not_waited_for() -> None:
    context = nftlib._context()
    with context._lock:  # as another thread's transaction would hold it
        assert nftlib.run_if_free("list tables") is None
    assert nftlib.run_if_free("list tables") is not None
