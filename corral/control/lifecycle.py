"""Pausing and resuming a sandbox as its record keeps it: its host first, then its record (how it is
paused and its expiry, in one write). A host that finds it already so is no failure: two callers (a
timeout's pause and a tenant's, two data-plane calls waking it through two replicas) may race."""

from __future__ import annotations

from corral.agent.client import AgentClient
from corral.agent.errors import AgentConflict
from corral.codes import ErrorCode
from corral.core.lifecycle import PAUSED_FILESYSTEM, PAUSED_MEMORY
from corral.store import SandboxRecord
from corral.store.contract import RecordStates


async def pause(
    store: RecordStates, client: AgentClient, record: SandboxRecord, *, memory: bool
) -> SandboxRecord:
    """Frozen with its memory, or (not ``memory``) emptied of its processes with its files kept; it
    then waits to be resumed rather than to expire."""
    try:
        await client.pause(record.id, memory=memory)
    except AgentConflict as exc:
        if exc.code != ErrorCode.SANDBOX_PAUSED:
            raise
    return await store.set_sandbox_paused(record.id, PAUSED_MEMORY if memory else PAUSED_FILESYSTEM, None)


async def resume(
    store: RecordStates, client: AgentClient, record: SandboxRecord, *, expires_at: float, memory: bool = True
) -> SandboxRecord:
    """Running again until ``expires_at``; not ``memory``: as a reboot (its processes ended first)."""
    try:
        await client.resume(record.id, memory=memory)
    except AgentConflict as exc:
        if exc.code != ErrorCode.SANDBOX_NOT_PAUSED:
            raise
    return await store.set_sandbox_paused(record.id, None, expires_at)
