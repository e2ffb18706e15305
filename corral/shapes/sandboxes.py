"""Sandboxes as the API describes them: one, a page of them, a batch just created."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from corral.shapes import Wire


class SandboxRecord(Wire):
    """One sandbox as the API describes it."""

    id: str
    name: str | None = None
    tenant: str | None = None
    template: str
    host_id: str | None = None
    # One of the server's sandbox states (``running``, ``waiting_capacity``, ...); a string, so an SDK
    # older than a state still reads it.
    state: str
    memory_mb: int | None = None
    cpus: float | None = None
    stateful: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime | None = None
    expires_at: datetime | None = None
    oom_kills: int = 0  # processes the kernel killed in it for overrunning its memory limit
    # Taken from a warm pool rather than started for this create.
    warm: bool = False
    failover: str = "orphan"
    epoch: int = 0  # how many times it was given a new host
    recreated_at: datetime | None = None
    image: str | None = None  # the image its root is made of (a digest); None: the host's own
    disk_mb: int | None = None  # its own disk's size, MiB
    # What its disk holds now (MiB), read from its host by GET of one sandbox; None elsewhere, and
    # when it has no disk of its own or its host did not answer.
    disk_used_mb: int | None = None
    # Its egress policy: {"mode": "none" | "internet", "allow_out": [CIDR...], "deny_out": [CIDR...]}.
    network: dict[str, Any] = Field(default_factory=lambda: {"mode": "none", "allow_out": [], "deny_out": []})


class SandboxPage(Wire):
    sandboxes: list[SandboxRecord]
    next_cursor: str | None = None


class BatchCreated(Wire):
    sandboxes: list[SandboxRecord]
