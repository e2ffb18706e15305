"""The warm-pool verbs and the placement read, on both clients: the asyncio one is the source the
blocking one is generated from, so each verb is driven through both against one recorded contract."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from corral.client import AsyncCorral, Corral

POOL = {"template": "py", "size": 3, "ready": 2, "starting": 1, "per_host": {"h1": {"target": 3, "ready": 2}}}
PLACEMENT = {"host_id": "h1", "candidates": 4}


def _handler(seen: list[tuple[str, str, Any]]) -> httpx.MockTransport:
    """One transport serves both clients: ``MockTransport`` is sync and async at once."""

    def handle(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        seen.append((request.method, request.url.raw_path.decode(), body))  # as sent, still quoted
        if request.url.path.endswith("/placement"):
            return httpx.Response(200, json=PLACEMENT)
        if request.method == "DELETE":
            return httpx.Response(204)
        if request.url.path == "/v1/pools" and request.method == "GET":
            return httpx.Response(200, json={"pools": [POOL]})
        return httpx.Response(200, json={**POOL, **(body or {})})

    return httpx.MockTransport(handle)


EXPECTED = [
    ("POST", "/v1/pools", {"template": "py", "size": 3, "max_per_host": 1}),
    ("GET", "/v1/pools", None),
    ("GET", "/v1/pools/a%2Fb", None),
    ("PATCH", "/v1/pools/py", {"size": 5}),
    ("DELETE", "/v1/pools/py", None),
    ("GET", "/v1/sandboxes/sb-1/placement", None),
]


def test_the_blocking_client_manages_pools_and_reads_a_placement() -> None:
    seen: list[tuple[str, str, Any]] = []
    with Corral("http://corral.test", transport=_handler(seen)) as client:
        assert client.pools.create("py", 3, max_per_host=1).size == 3
        assert [p.template for p in client.pools.list()] == ["py"]
        assert client.pools.get("a/b").per_host["h1"].ready == 2
        assert client.pools.resize("py", 5).size == 5
        client.pools.delete("py")
        assert client.sandboxes.placement("sb-1") == PLACEMENT
    assert seen == EXPECTED


def test_the_asyncio_client_manages_pools_and_reads_a_placement() -> None:
    seen: list[tuple[str, str, Any]] = []

    async def run() -> None:
        async with AsyncCorral("http://corral.test", transport=_handler(seen)) as client:
            assert (await client.pools.create("py", 3, max_per_host=1)).size == 3
            assert [p.template for p in await client.pools.list()] == ["py"]
            assert (await client.pools.get("a/b")).per_host["h1"].ready == 2
            assert (await client.pools.resize("py", 5)).size == 5
            await client.pools.delete("py")
            assert await client.sandboxes.placement("sb-1") == PLACEMENT

    asyncio.run(run())
    assert seen == EXPECTED
