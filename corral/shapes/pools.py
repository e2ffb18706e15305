"""Warm pools as the admin API describes them. A pool keeps ``size`` sandboxes of a template booted and
unowned; a create of that template that asks for nothing else takes one (``"warm": true``)."""

from __future__ import annotations

from pydantic import Field

from corral.shapes import Wire


class PoolHost(Wire):
    target: int = 0
    ready: int = 0
    starting: int = 0


class Pool(Wire):
    template: str
    size: int
    max_per_host: int | None = None
    ready: int = 0
    starting: int = 0
    per_host: dict[str, PoolHost] = Field(default_factory=dict)
    hits: int = 0
    misses: int = 0


class PoolList(Wire):
    pools: list[Pool]
