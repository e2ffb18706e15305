"""Unreferenced images are collected; referenced and young ones stay."""

from __future__ import annotations

from pathlib import Path

from corral.images.digest import digest_file
from corral.images.dirstore import DirBlobStore
from corral.images.gc import collect_unreferenced


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
