"""Unreferenced images are collected; referenced and young ones stay."""

from __future__ import annotations

from pathlib import Path

from corral.images.digest import digest_file
from corral.images.dirstore import DirBlobStore
from corral.images.gc import ImageCollector, collect_unreferenced


async def test_only_images_no_one_names_are_collected(tmp_path: Path) -> None:
    blobs = DirBlobStore(tmp_path / "blobs")
    digests = []
    for name in ("old", "current", "sandbox", "fresh"):
        source = tmp_path / name
        source.write_bytes(name.encode() * 100)
        digest = digest_file(source)
        await blobs.put(digest, source)
        digests.append(digest)
    old, current, sandbox, fresh = digests
    gone = await collect_unreferenced(blobs, {current, sandbox}, is_young=lambda d: d == fresh)
    assert gone == [old]
    assert sorted(await blobs.digests()) == sorted([current, sandbox, fresh])
    assert await collect_unreferenced(blobs, {current, sandbox, fresh}) == []


async def test_the_collector_deletes_an_image_only_after_a_grace_unnamed(tmp_path: Path) -> None:
    blobs = DirBlobStore(tmp_path / "blobs")
    digests = []
    for name in ("kept", "dropped"):
        source = tmp_path / name
        source.write_bytes(name.encode() * 100)
        digests.append(digest_file(source))
        await blobs.put(digests[-1], source)
    kept, dropped = digests
    named = {kept, dropped}
    now = [1000.0]

    async def referenced() -> set[str]:
        return set(named)

    gc = ImageCollector(blobs, referenced, lambda: now[0], grace_s=600)
    assert await gc.sweep() == []
    named.discard(dropped)
    assert await gc.sweep() == []  # first found unnamed now
    now[0] += 599
    assert await gc.sweep() == []
    named.add(dropped)  # named again (a sandbox of it came back from a host): the grace starts over
    now[0] += 10
    assert await gc.sweep() == []
    named.discard(dropped)
    assert await gc.sweep() == []
    now[0] += 600
    assert await gc.sweep() == [dropped]
    assert await blobs.digests() == [kept]
    # tick sweeps at most once per interval, and a failing sweep is not fatal.
    assert await gc.tick(every_s=60) == []
    now[0] += 1

    async def failing() -> set[str]:
        raise OSError("store unreachable")

    gc.referenced = failing
    assert await gc.tick(every_s=60) == []  # within the interval: no sweep at all
    now[0] += 60
    assert await gc.tick(every_s=60) == []  # swept, failed, logged
    assert await blobs.digests() == [kept]
