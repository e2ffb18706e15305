"""What the warm-pool endpoints (``client.pools``, admin token) answer: the server's own shapes
(:mod:`corral.shapes.pools`), and where a pool lives."""

from __future__ import annotations

from urllib.parse import quote

from corral.shapes.pools import Pool, PoolHost, PoolList

__all__ = ["Pool", "PoolHost", "PoolList", "pool_path"]


def pool_path(template: str) -> str:
    return f"/v1/pools/{quote(template, safe='')}"
