"""The burst bar with images: fifty creates of a fresh template (an image no host holds yet) on twelve
hosts fetch the image at most once per host and spread as a burst without images does; once the hosts
say they hold it, the next burst still spreads and fetches nothing."""

from __future__ import annotations

import asyncio
import os
import statistics
from collections import Counter
from pathlib import Path

from corral.images import digest_file
from corral.store import TemplateRecord

from .conftest import ADMIN, Cluster


async def _burst(c: Cluster, image: str, n: int = 50) -> list[int]:
    async def one() -> tuple[int, dict]:  # type: ignore[type-arg]
        r = await c.http.post(
            "/v1/sandboxes", json={"template": "fresh", "memory_mb": 2048}, headers=c.as_(ADMIN)
        )
        return r.status_code, r.json()

    results = await asyncio.gather(*(one() for _ in range(n)))
    assert all(status == 201 for status, _ in results), results[:3]
    assert {body["image"] for _, body in results} == {image}  # every record names the image
    per_host = Counter(body["host_id"] for _, body in results)
    return [per_host.get(a.id, 0) for a in c.fleet.agents]


async def test_fifty_creates_of_a_fresh_template_fetch_once_per_host_and_spread(
    cluster: Cluster, tmp_path: Path
) -> None:
    src = tmp_path / "fresh.erofs"
    src.write_bytes(os.urandom(1 << 20))
    digest = digest_file(src)
    assert cluster.plane.images.blobs is not None
    await cluster.plane.images.blobs.put(digest, src)
    await cluster.plane.create_template(TemplateRecord(name="fresh", cpus=1.0, memory_mb=512, image=digest))

    counts = await _burst(cluster, digest)
    assert max(counts) <= 5 and statistics.median(counts) >= 3, counts
    fetches = [a.images.fetches if a.images is not None else -1 for a in cluster.fleet.agents]
    assert fetches == [1 if n else 0 for n in counts], (fetches, counts)

    await cluster.beat()  # the hosts say they hold it now
    hosts = {h.record.id: h.record.images for h in await cluster.plane.hosts()}
    assert all(digest in hosts[a.id] for a, n in zip(cluster.fleet.agents, counts, strict=True) if n)
    again = await _burst(cluster, digest)
    assert max(again) <= 5, again
    # At most one transfer per host over both bursts: hosts new to the image in the second fetched it once.
    assert all(a.images is not None and a.images.fetches <= 1 for a in cluster.fleet.agents)
    assert all(
        a.images is not None and a.images.fetches == 1
        for a, n in zip(cluster.fleet.agents, again, strict=True)
        if n
    )
