"""What the control plane's flows need from the state of record and from the fleet, as narrow
protocols: the create flow, batch creates, failover, the reconciler, warm pools, waiting creates,
heartbeat intake, re-sealing and explanations each depend on the few methods they call, never on the
whole :class:`corral.store.Store`.

Every store method is declared once, in a face of the store's contract (:mod:`corral.store.contract`);
a port here is such a face or a combination of them. The SQL stores satisfy them, and so does the
in-memory store model (:mod:`corral.testing.store.conformance` makes mypy prove both), which is what
lets the real flows run on virtual time under injected faults.
"""

from __future__ import annotations

from typing import Protocol

from corral.agent.client import AgentClient
from corral.store.contract import (
    ClaimRecords,
    CommittedMemory,
    HeartbeatSink,
    HostReader,
    Leases,
    Listings,
    Parking,
    Placements,
    PoolReader,
    PoolStore,
    RecordCreate,
    RecordReads,
    RecordStates,
    RecordSweeps,
    Rehoming,
    Reservations,
    SealedSpecReader,
    SealedSpecs,
    TemplateReader,
    TenantDirectory,
    TenantUsage,
)


class SandboxRecords(RecordCreate, RecordReads, RecordStates, Protocol):
    """Sandbox records: written, read, moved between states, deleted."""


class SandboxLifecycle(Rehoming, RecordSweeps, Protocol):
    """What only the leader does to records: fail a dead host, give a sandbox a new host and epoch,
    find sandboxes past their TTL, forget old idempotency keys."""


class Specs(TemplateReader, SealedSpecReader, Protocol):
    """What a sandbox is started from: its template and its sealed spec."""


class Tenants(TenantUsage, CommittedMemory, Protocol):
    """A tenant's usage and the memory promised fleet-wide."""


class WaitingQueue(RecordReads, RecordStates, Parking, Protocol):
    """Creates parked for capacity: parked, looked at, ended; placing one goes through the create flow."""


class CreatePort(SandboxRecords, Reservations, Specs, Protocol):
    """What the create flow (and batch creates) write through."""


class FailoverPort(CreatePort, SandboxLifecycle, Protocol):
    """What failover writes through: placement as a create gets it, plus the leader's lifecycle."""


class ReconcilePort(FailoverPort, Leases, Listings, Tenants, Protocol):
    """What the reconciler, the leader's loop, writes through."""


class AgentLookup(Protocol):
    """Where a host's agent is reached."""

    def client(self, host_id: str, address: str) -> AgentClient: ...


__all__ = [
    "AgentLookup",
    "ClaimRecords",
    "CreatePort",
    "FailoverPort",
    "HeartbeatSink",
    "HostReader",
    "Leases",
    "Listings",
    "Placements",
    "PoolReader",
    "PoolStore",
    "RatesPort",
    "ReconcilePort",
    "RecordCreate",
    "RecordReads",
    "RecordStates",
    "Reservations",
    "SandboxLifecycle",
    "SandboxRecords",
    "SealedSpecs",
    "Specs",
    "Tenants",
    "WaitingQueue",
]


class RatesPort(TenantDirectory, Leases, Protocol):
    """Where each replica reads its tenants' create rates, and how many replicas share each."""
