"""corral's policy core: pure, synchronous, with its clock and randomness injected. Imports nothing of
corral outside itself, and no I/O."""

from corral.core.admission import (
    DEFAULT_POLICY,
    AdmissionBook,
    AdmissionPolicy,
    Oversize,
    admittable_mb,
    charge_mb,
    cpu_fits,
    fit_terms,
    fits,
    host_fits,
    memory_fits,
    oversize,
    request_charge_mb,
    reserve_mb,
)
from corral.core.clock import Clock, ManualClock
from corral.core.filters import DEFAULT_FILTERS, Filter, FilterContext, Reason, first_failure
from corral.core.fit import FIT_RULE, TAKES_STATE, Bound, Term, tie_rank
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
    "FIT_RULE",
    "TAKES_STATE",
    "AdmissionBook",
    "AdmissionMode",
    "AdmissionPolicy",
    "Bound",
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
    "Oversize",
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
    "Term",
    "Timeouts",
    "TouchModel",
    "TouchProfile",
    "admittable_mb",
    "candidate_limit",
    "charge_mb",
    "cpu_fits",
    "first_failure",
    "fit_terms",
    "fits",
    "host_fits",
    "memory_fits",
    "oversize",
    "request_charge_mb",
    "reserve_mb",
    "tie_rank",
]
