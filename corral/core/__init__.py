"""corral's policy core: pure, synchronous, with its clock and randomness injected. Imports nothing of
corral outside itself, and no I/O."""

from corral.core.admission import (
    DEFAULT_POLICY,
    AdmissionBook,
    AdmissionPolicy,
    admittable_mb,
    charge_mb,
    cpu_fits,
    fits,
    host_fits,
    memory_fits,
    request_charge_mb,
    reserve_mb,
)
from corral.core.clock import Clock, ManualClock
from corral.core.filters import DEFAULT_FILTERS, Filter, FilterContext, Reason, first_failure
from corral.core.ledger import Ledger, Reservation
from corral.core.placement import Decision, Placer, Scheduler
from corral.core.pressure import PressureGate
from corral.core.refusals import NoCapacity, NoHealthyHosts, Refusal
from corral.core.scoring import Scorer, ScoreWeights, Strategy
from corral.core.selection import FullScan, Jitter, Naive, PowerOfK, Selector, candidate_limit
from corral.core.timeouts import ConfigError, Timeouts
from corral.core.touch import TouchModel, TouchProfile
from corral.core.types import (
    AdmissionMode,
    CreateRequest,
    FleetView,
    HostFacts,
    HostState,
    HostView,
    Pending,
    SandboxUsage,
)

__all__ = [
    "DEFAULT_FILTERS",
    "DEFAULT_POLICY",
    "AdmissionBook",
    "AdmissionMode",
    "AdmissionPolicy",
    "Clock",
    "ConfigError",
    "CreateRequest",
    "Decision",
    "Filter",
    "FilterContext",
    "FleetView",
    "FullScan",
    "HostFacts",
    "HostState",
    "HostView",
    "Jitter",
    "Ledger",
    "ManualClock",
    "Naive",
    "NoCapacity",
    "NoHealthyHosts",
    "Pending",
    "Placer",
    "PowerOfK",
    "PressureGate",
    "Reason",
    "Refusal",
    "Reservation",
    "SandboxUsage",
    "Scheduler",
    "ScoreWeights",
    "Scorer",
    "Selector",
    "Strategy",
    "Timeouts",
    "TouchModel",
    "TouchProfile",
    "admittable_mb",
    "candidate_limit",
    "charge_mb",
    "cpu_fits",
    "first_failure",
    "fits",
    "host_fits",
    "memory_fits",
    "request_charge_mb",
    "reserve_mb",
]
