"""``client.pools``: warm pools (admin token). A pool keeps ``size`` sandboxes of a template booted and
unowned; a create of that template that asks for nothing else takes one (``"warm": true``)."""

from __future__ import annotations

import builtins
from typing import Any
from urllib.parse import quote

from pydantic import Field

from corral.client.models import _Wire, parse


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


class Pools:
    def __init__(self, client: Any) -> None:
        self._client = client

    def create(self, template: str, size: int, *, max_per_host: int | None = None) -> Pool:
        body: dict[str, Any] = {"template": template, "size": size}
        if max_per_host is not None:
            body["max_per_host"] = max_per_host
        return parse(Pool, self._client.request("POST", "/v1/pools", json=body))

    def list(self) -> builtins.list[Pool]:
        return parse(PoolList, self._client.request("GET", "/v1/pools")).pools

    def get(self, template: str) -> Pool:
        return parse(Pool, self._client.request("GET", pool_path(template)))

    def resize(self, template: str, size: int) -> Pool:
        return parse(Pool, self._client.request("PATCH", pool_path(template), json={"size": size}))

    def delete(self, template: str) -> None:
        self._client.request("DELETE", pool_path(template))
