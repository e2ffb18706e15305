"""The blob store's contract, on every backend (a directory, PostgreSQL): bytes kept under their digest,
checked before they are kept, read back whole by any replica."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from corral.images import BlobNotFound, BlobStore, DirBlobStore, digest_file

from .conftest import Opener


def _blob(tmp_path: Path, data: bytes, name: str = "src") -> tuple[Path, str]:
    src = tmp_path / name
    src.write_bytes(data)
    return src, digest_file(src)


async def _read(store: BlobStore, digest: str) -> bytes:
    return b"".join([c async for c in store.read(digest)])


async def test_a_blob_put_is_read_back_whole(blobs: BlobStore, tmp_path: Path) -> None:
    data = os.urandom(3 << 20) + b"tail"
    src, digest = _blob(tmp_path, data)
    await blobs.put(digest, src)
    await blobs.put(digest, src)  # idempotent
    assert await blobs.has(digest)
    assert await blobs.size(digest) == len(data)
    assert await _read(blobs, digest) == data
    assert await blobs.digests() == [digest]
    await blobs.delete(digest)
    await blobs.delete(digest)  # absent is not an error
    assert not await blobs.has(digest)
    assert await blobs.digests() == []
    with pytest.raises(BlobNotFound):
        await blobs.size(digest)
    with pytest.raises(BlobNotFound):
        await _read(blobs, digest)


async def test_an_empty_blob_is_a_blob(blobs: BlobStore, tmp_path: Path) -> None:
    src, digest = _blob(tmp_path, b"")
    await blobs.put(digest, src)
    assert await blobs.size(digest) == 0 and await _read(blobs, digest) == b""


async def test_bytes_that_do_not_hash_to_the_digest_are_not_kept(blobs: BlobStore, tmp_path: Path) -> None:
    src, _ = _blob(tmp_path, os.urandom(200_000))
    _, other = _blob(tmp_path, b"what was claimed", "claimed")
    with pytest.raises(ValueError):
        await blobs.put(other, src)
    assert not await blobs.has(other)
    assert await blobs.digests() == []


BAD_DIGESTS = [
    "../../etc/passwd",
    "sha256:" + "0" * 63,
    "sha256:" + "A" * 64,
    "md5:abc",
    "sha256:" + "0" * 64 + "\n",
]


async def test_a_digest_that_is_not_one_names_nothing(blobs: BlobStore) -> None:
    for digest in BAD_DIGESTS:
        for op in (blobs.has, blobs.delete, blobs.size):
            with pytest.raises(ValueError):
                await op(digest)


async def test_every_replica_serves_what_one_put(replicas: Opener, tmp_path: Path) -> None:
    one, two = await replicas(), await replicas()
    data = os.urandom(1 << 20)
    src, digest = _blob(tmp_path, data)
    await one.put(digest, src)
    assert await two.has(digest) and await _read(two, digest) == data
    await two.delete(digest)
    assert not await one.has(digest)


async def test_two_replicas_putting_one_image_at_once_keep_it_once(replicas: Opener, tmp_path: Path) -> None:
    one, two = await replicas(), await replicas()
    data = os.urandom(600_000)
    src, digest = _blob(tmp_path, data)
    await asyncio.gather(one.put(digest, src), two.put(digest, src))
    assert await one.digests() == [digest]
    assert await _read(two, digest) == data


def test_a_crash_mid_put_leaves_nothing_after_reopening(tmp_path: Path) -> None:
    root = tmp_path / "blobs"
    DirBlobStore(root)
    (root / "sha256-abc.123.456.partial").write_bytes(b"half")
    store = DirBlobStore(root)
    assert list(store.root.iterdir()) == []
