"""How one control-plane replica is tuned. Orderings between timeouts are checked at start-up."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from corral.control.errors import InvalidRequest
from corral.core import AdmissionPolicy, ConfigError, Strategy, Timeouts
from corral.core.fair import DEFAULT_CREATES_IN_FLIGHT
from corral.core.inflight import (
    DEFAULT_EXECS_PER_SANDBOX,
    DEFAULT_EXECS_PER_TENANT,
    DEFAULT_PORT_REQUESTS_PER_SANDBOX,
)
from corral.core.rates import Rate
from corral.runtime.process import MIN_MEMORY_MB


def default_replica_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True, slots=True)
class ControlConfig:
    replica_id: str = field(default_factory=default_replica_id)
    timeouts: Timeouts = field(default_factory=Timeouts)
    policy: AdmissionPolicy = field(default_factory=AdmissionPolicy)
    # Power-of-K choices. None: Nomad's candidate limit, max(2, ceil(log2 hosts)); 0: K = all (a
    # full scan). The K sampled hosts go to the store, which reserves on the one with the most room by
    # its current totals, so replicas see each other's in-flight work at the moment of commit.
    k: int | None = None
    # Spread (the default: a flat fleet, room for spikes) or pack (fill hosts so others can retire).
    strategy: Strategy = Strategy.SPREAD
    # Placement attempts per create: a conflict at reserve or a retryable agent refusal costs one.
    max_attempts: int = 6
    replica_lease_s: float = 15.0
    reconcile_interval_s: float = 1.0
    # How long a refused create waits before the client should try again, at least and at most.
    retry_after_min_s: float = 1.0
    retry_after_max_s: float = 30.0
    # Per-tenant defaults for a tenant created implicitly (the built-in "default" tenant).
    default_max_sandboxes: int = 10_000_000
    default_max_memory_mb: int = 1 << 40
    default_max_cpus: float = float(1 << 30)
    max_batch: int = 500
    # The least memory a sandbox may ask for: what the strictest runtime can start at all. A smaller
    # request is the caller's mistake (422), never a capacity refusal the SDKs would retry.
    min_memory_mb: int = MIN_MEMORY_MB
    # The longest a create may ask to wait for capacity (``wait_s``), and how many may wait per tenant.
    max_wait_s: float = 300.0
    max_waiting_per_tenant: int = 1000
    # Data-plane calls (execs, E2B commands and file operations) one tenant may have in flight through
    # this replica; each sandbox's own bound is its agent's.
    max_execs_per_tenant: int = DEFAULT_EXECS_PER_TENANT
    # A tenant's execs in flight on one sandbox through this replica, counted before the store is read
    # so that a flood's excess costs the replica almost nothing; the agents' own bound (the one that
    # holds across replicas) is the same by default. None: only the agents count.
    max_execs_per_sandbox: int | None = DEFAULT_EXECS_PER_SANDBOX
    # A tenant's create rate when its record names none, summed over every replica (each enforces its
    # share); None: unbounded. Set per tenant with PATCH /v1/tenants/{name}.
    default_create_rate: Rate | None = None
    # How often a replica reads the tenants' rates and counts the live replicas again.
    rate_refresh_s: float = 5.0
    # How long a create waits for its template's ready check to pass before it is refused
    # (``sandbox_not_ready``) and its sandbox removed (see control/readiness.py).
    ready_timeout_s: float = 60.0
    # Creates this replica works on at once (record, claim, placement); the rest wait their turn,
    # tenant by tenant round-robin, so one tenant's burst delays another's first create by one turn.
    max_creates_in_flight: int = DEFAULT_CREATES_IN_FLIGHT
    # Where sandboxes' ports are reached: ``{port}-{sandbox_id}.{domain}`` on any replica (a port
    # after the name is ignored when matching). Returned on creates; None: ports by path only.
    domain: str | None = None
    # Requests to one sandbox's ports this replica relays at once (WebSockets included); more: 429.
    max_port_requests_per_sandbox: int = DEFAULT_PORT_REQUESTS_PER_SANDBOX

    def check_memory(self, memory_mb: int, field: str = "memory_mb") -> None:
        """A sandbox's (or a template's) memory is at least ``min_memory_mb``, else a 422 naming
        ``field`` as the caller spelled it."""
        if memory_mb < self.min_memory_mb:
            raise InvalidRequest(field, f"{field}: at least {self.min_memory_mb} MiB, got {memory_mb}")

    @property
    def create_deadline_s(self) -> float:
        """The longest a live replica can spend on one create: every attempt binding to the limit.
        A record still unplaced after this was left by a replica that died."""
        # One attempt more than a create may make covers the store's own latency between binds.
        return (self.max_attempts + 1) * self.timeouts.bind_timeout_s

    def __post_init__(self) -> None:
        if self.k is not None and self.k < 0:
            raise ConfigError("k must be >= 0 (0 = full scan)")
        if self.max_execs_per_tenant < 1:
            raise ConfigError("max_execs_per_tenant must be >= 1")
        if self.max_execs_per_sandbox is not None and self.max_execs_per_sandbox < 1:
            raise ConfigError("max_execs_per_sandbox must be >= 1")
        if self.max_creates_in_flight < 1:
            raise ConfigError("max_creates_in_flight must be >= 1")
        if not self.rate_refresh_s > 0:
            raise ConfigError("rate_refresh_s must be > 0")
        if self.max_attempts < 1:
            raise ConfigError("max_attempts must be >= 1")
        if self.replica_lease_s <= self.reconcile_interval_s:
            raise ConfigError(
                "replica_lease_s must exceed reconcile_interval_s, or a live replica loses its lease"
            )
        if not 0 < self.retry_after_min_s <= self.retry_after_max_s:
            raise ConfigError("need 0 < retry_after_min_s <= retry_after_max_s")
