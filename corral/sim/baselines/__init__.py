"""Models of other schedulers, for the baselines corral is compared with: a discrete-event fleet
(:mod:`~corral.sim.baselines.fleet`) of modelled hosts (:mod:`~corral.sim.baselines.host`) on its own
event loop (:mod:`~corral.sim.baselines.events`), placing with the core's filters, scoring, selection,
admission arithmetic and ledger under each policy (:mod:`~corral.sim.baselines.policies`: no ledger,
per-replica ledgers, agents without a gate, and corral's own configuration).

    fleet = ModelFleet(ModelFleetConfig(hosts=12, policy=policy("naive"), replicas=4), seed=1)
    fleet.burst(CreateRequest(memory_mb=4096), n=50, start=40.0, window_s=0.2)
    fleet.run(until=200.0)
    fleet.metrics.placements  # creates per host
"""

from corral.sim.baselines.events import EventLoop
from corral.sim.baselines.fleet import (
    Create,
    HostTable,
    Metrics,
    ModelFleet,
    ModelFleetConfig,
    Outcome,
    SimReplica,
)
from corral.sim.baselines.host import SimHost, SimSandbox
from corral.sim.baselines.policies import BURST_POLICIES, POLICIES, LedgerScope, Policy, policy

__all__ = [
    "BURST_POLICIES",
    "POLICIES",
    "Create",
    "EventLoop",
    "HostTable",
    "LedgerScope",
    "Metrics",
    "ModelFleet",
    "ModelFleetConfig",
    "Outcome",
    "Policy",
    "SimHost",
    "SimReplica",
    "SimSandbox",
    "policy",
]
