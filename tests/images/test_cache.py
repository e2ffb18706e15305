"""A host's image cache: one transfer per digest however many creates ask at once, every transfer
checked against the digest (a corrupted one is thrown away and fetched again, never used), a disk
budget kept by evicting the least recently used images no sandbox uses, and all of it kept across a
restart."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from corral.images import DirBlobStore, digest_file
from corral.images.cache import ImageCache, ImageUnavailable

SIZE = 300_000


class Source:
    """The control plane's blobs as a host reaches them, counting transfers; ``faults`` spoil the
    next transfers in turn: "flip" a byte, "cut" the stream short, "stall" until released."""

    def __init__(self, root: Path) -> None:
        self.blobs = DirBlobStore(root)
        self.reads: Counter[str] = Counter()
        self.faults: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()

    async def add(self, tmp: Path, data: bytes) -> str:
        src = tmp / f"img-{len(self.reads)}-{os.urandom(4).hex()}"
        src.write_bytes(data)
        digest = digest_file(src)
        await self.blobs.put(digest, src)
        return digest

    async def read(self, digest: str) -> AsyncIterator[bytes]:
        self.reads[digest] += 1
        fault = self.faults.pop(0) if self.faults else None
        await self.gate.wait()
        async for chunk in self.blobs.read(digest):
            if fault == "flip":
                chunk = bytes([chunk[0] ^ 1]) + chunk[1:]
                fault = None
            if fault == "cut":
                yield chunk[: len(chunk) // 2]
                raise ConnectionError("the stream was cut")
            yield chunk
            await asyncio.sleep(0)


@pytest.fixture
def source(tmp_path: Path) -> Source:
    return Source(tmp_path / "control-plane")


def _cache(tmp_path: Path, source: Source, budget: int = 10 * SIZE) -> ImageCache:
    return ImageCache(tmp_path / "host", source, budget, retry_base_s=0.001)


async def test_twenty_concurrent_resolves_on_a_host_that_lacked_the_image_do_one_fetch(
    tmp_path: Path, source: Source
) -> None:
    data = os.urandom(3 << 20)
    digest = await source.add(tmp_path, data)
    cache = _cache(tmp_path, source, budget=10 << 20)
    source.gate.clear()  # all twenty are waiting before the one transfer starts sending
    waiters = [asyncio.create_task(cache.local_path(digest)) for _ in range(20)]
    await asyncio.sleep(0.01)
    source.gate.set()
    paths = await asyncio.gather(*waiters)
    assert source.reads[digest] == 1 and cache.fetches == 1
    assert set(paths) == {cache.path(digest)} and paths[0].read_bytes() == data
    assert cache.users(digest) == 20 and cache.held() == [digest]
    for _ in range(20):
        cache.release(digest)
    assert cache.users(digest) == 0
    await cache.local_path(digest)  # held: no second transfer
    assert source.reads[digest] == 1


async def test_a_waiter_that_gives_up_leaves_the_fetch_to_the_others(tmp_path: Path, source: Source) -> None:
    digest = await source.add(tmp_path, os.urandom(SIZE))
    cache = _cache(tmp_path, source)
    source.gate.clear()
    quitter = asyncio.create_task(cache.local_path(digest))
    stayer = asyncio.create_task(cache.local_path(digest))
    await asyncio.sleep(0.01)
    quitter.cancel()
    source.gate.set()
    assert await stayer == cache.path(digest)
    assert source.reads[digest] == 1 and cache.users(digest) == 1


@pytest.mark.parametrize("fault", ["flip", "cut"])
async def test_a_corrupted_transfer_is_refused_and_fetched_again(
    tmp_path: Path, source: Source, fault: str
) -> None:
    data = os.urandom(SIZE)
    digest = await source.add(tmp_path, data)
    cache = _cache(tmp_path, source)
    source.faults = [fault]
    path = await cache.local_path(digest)
    assert source.reads[digest] == 2 and cache.refused == 1
    assert path.read_bytes() == data and digest_file(path) == digest


async def test_an_image_no_transfer_delivers_is_never_used(tmp_path: Path, source: Source) -> None:
    digest = await source.add(tmp_path, os.urandom(SIZE))
    cache = _cache(tmp_path, source)
    source.faults = ["flip"] * cache.attempts
    with pytest.raises(ImageUnavailable, match="transfers failed"):
        await cache.local_path(digest)
    assert not cache.has(digest) and list(cache.root.iterdir()) == []
    # An image the control plane does not have is not asked for again and again.
    missing = "sha256:" + "0" * 64
    with pytest.raises(ImageUnavailable, match="no such image"):
        await cache.local_path(missing)
    assert source.reads[missing] == 1


async def test_lru_eviction_under_a_small_budget_spares_what_sandboxes_use(
    tmp_path: Path, source: Source
) -> None:
    a, b, c, d = [await source.add(tmp_path, os.urandom(SIZE)) for _ in range(4)]
    cache = _cache(tmp_path, source, budget=int(2.5 * SIZE))
    await cache.local_path(a)  # a sandbox uses a, the oldest, throughout
    await cache.local_path(b)
    cache.release(b)
    await cache.local_path(c)
    cache.release(c)
    # Three images over a budget of two and a half: b, the least recently used of those unused, went.
    assert set(cache.held()) == {a, c} and not cache.path(b).exists()
    await cache.local_path(c)  # c used again: now the most recent
    cache.release(c)
    await cache.local_path(d)
    cache.release(d)
    assert set(cache.held()) == {a, d} and cache.used_bytes <= cache.budget_bytes
    # Used past the budget rather than refused: every image in use stays.
    await cache.local_path(b)
    await cache.local_path(c)
    assert {a, b, c} <= set(cache.held())
    cache.release(b)
    assert b not in cache.held() and set(cache.held()) == {a, c}


async def test_the_cache_survives_a_restart_and_rechecks_what_it_finds(
    tmp_path: Path, source: Source
) -> None:
    a, b = [await source.add(tmp_path, os.urandom(SIZE)) for _ in range(2)]
    cache = _cache(tmp_path, source)
    await cache.local_path(a)
    await cache.local_path(b)
    (cache.root / "sha256-cut.123.partial").write_bytes(b"half")  # a transfer a crash cut short
    again = _cache(tmp_path, source)
    assert sorted(again.held()) == sorted([a, b])
    assert [p.name for p in again.root.iterdir() if "partial" in p.name] == []
    assert again.hold(a) and again.users(a) == 1  # an adopted sandbox counts without a fetch
    # A file changed on disk meanwhile is hashed before its first use, and fetched again.
    p = again.path(b)
    p.write_bytes(b"x" + p.read_bytes()[1:])
    assert digest_file(await again.local_path(b)) == b
    assert source.reads == Counter({a: 1, b: 2})
    assert digest_file(await again.local_path(a)) == a and source.reads[a] == 1


async def test_a_digest_that_is_not_one_is_refused_before_any_transfer(
    tmp_path: Path, source: Source
) -> None:
    cache = _cache(tmp_path, source)
    for bad in ["../../etc/passwd", "sha256:" + "0" * 64 + "\n", "sha256:" + "G" * 64]:
        with pytest.raises(ValueError):
            await cache.local_path(bad)
    assert not source.reads
