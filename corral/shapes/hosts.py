"""Hosts as the admin API describes them, and a host's credentials from enrolment."""

from __future__ import annotations

from pydantic import Field

from corral.shapes import ID_PATTERN, Wire

# The state of a host enrolled but never heard from (its store state says nothing yet); it has no
# heartbeat age.
JOINING = "joining"


class Host(Wire):
    """One host as the admin API describes it: its published admission verdict and its load."""

    id: str
    state: str
    heartbeat_age_s: float | None = None  # None while it is joining
    cpu_total: float = 0.0
    cpu_used: float = 0.0
    memory_mb_total: int = 0
    memory_mb_used: int = 0
    memory_mb_admittable: int = 0
    memory_admission: str | None = None
    reserved_mb: int = 0
    sandboxes: int = 0
    runtime: str = ""
    address: str = ""
    # Warm sandboxes per template: {"ready": n, "starting": n}.
    warm: dict[str, dict[str, int]] = Field(default_factory=dict)


class HostList(Wire):
    hosts: list[Host]


class HostCredentials(Wire):
    """A host's credentials, as enrolment hands them out (``POST /v1/hosts/{id}/token``, ``corral hosts
    token ID --out FILE``) and as ``corral agent --token-file FILE`` reads them back. Shown once: the
    control plane keeps only a hash of the agent token.

    ``agent_token`` is what the agent presents to the control plane (heartbeats; it speaks for this
    host only). ``host_key`` is what the control plane presents to the agent; the agent refuses every
    call without it. The file holds both secrets: write it where only the agent's user can read it."""

    host_id: str = Field(pattern=ID_PATTERN)
    agent_token: str = Field(min_length=16, max_length=512)
    host_key: str = Field(min_length=16, max_length=512)
