"""What the warm-pool endpoints (``client.pools``, admin token) answer. A pool keeps ``size`` sandboxes
of a template booted and unowned; a create of that template that asks for nothing else takes one (``"warm": true``)."""

from __future__ import annotations

from urllib.parse import quote

from pydantic import Field

from corral.client.models import _Wire


class PoolHost(_Wire):
    target: int = 0
    ready: int = 0
    starting: int = 0


class Pool(_Wire):
    template: str
    size: int
    max_per_host: int | None = None
    ready: int = 0
    starting: int = 0
    per_host: dict[str, PoolHost] = Field(default_factory=dict)
    hits: int = 0
    misses: int = 0


class PoolList(_Wire):
    pools: list[Pool]


def pool_path(template: str) -> str:
    return f"/v1/pools/{quote(template, safe='')}"
