"""A deterministic discrete-event simulator of a corral fleet, driving the core's own filters, scoring,
selection, admission arithmetic and ledger on a virtual clock. A run is a pure function of its
configuration and seed: a failing seed replays exactly.

    fleet = Fleet(FleetConfig(hosts=12, policy=policy("corral"), replicas=4), seed=1)
    fleet.burst(CreateRequest(memory_mb=4096), n=50, start=40.0, window_s=0.2)
    fleet.run(until=200.0)
    fleet.metrics.placements  # creates per host

The experiments behind ``corral sim ...`` live in :mod:`corral.sim.experiments`; charts in
:mod:`corral.sim.plots`; the report in :mod:`corral.sim.report`. ``corral sim chaos``
(:mod:`corral.sim.chaos`) runs the control plane's real flows instead, on an event loop with a virtual
clock (:mod:`corral.sim.vtime`) over an in-memory model of the store (:mod:`corral.testing.store`).
"""

from corral.sim.events import EventLoop
from corral.sim.fleet import (
    ClientBackoff,
    Create,
    Fleet,
    FleetConfig,
    HostTable,
    Metrics,
    Outcome,
    SimReplica,
)
from corral.sim.host import HostSpec, SimHost, SimSandbox
from corral.sim.policies import BURST_POLICIES, POLICIES, LedgerScope, Policy, policy

__all__ = [
    "BURST_POLICIES",
    "POLICIES",
    "ClientBackoff",
    "Create",
    "EventLoop",
    "Fleet",
    "FleetConfig",
    "HostSpec",
    "HostTable",
    "LedgerScope",
    "Metrics",
    "Outcome",
    "Policy",
    "SimHost",
    "SimReplica",
    "SimSandbox",
    "policy",
]
