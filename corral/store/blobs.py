"""The blob store of replicas on PostgreSQL (:class:`~corral.images.blobs.BlobStore`): every replica
serves every image from the database they share, with nothing on any replica's disk.

A blob is rows of one chunk each (``image_chunks``) and one ``image_blobs`` row, written last in the
same transaction once the chunks hash to the digest: a reader that finds the row finds every chunk,
and a put that fails (bytes that do not hash, a lost connection) leaves nothing. A read is one short
query per chunk on a pooled connection, never a transaction held open for the whole stream, so a slow
reader ties up no connection and a large image never sits in one replica's memory.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg

from corral.images.blobs import BlobNotFound
from corral.images.digest import check_digest
from corral.store.postgres import PostgresStore, _PgTx

# 1 MiB per row: below PostgreSQL's TOAST chunking overhead being noticeable, and what one read
# holds in memory per stream.
CHUNK = 1 << 20


class PostgresBlobStore:
    """Blobs in the tables of ``store``'s schema (migration 16), through its pool and its breaker."""

    def __init__(self, store: PostgresStore, chunk: int = CHUNK) -> None:
        if chunk <= 0:
            raise ValueError("chunk must be positive")
        self.store = store
        self.chunk = chunk

    async def put(self, digest: str, source: Path) -> None:
        check_digest(digest)
        now = self.store._now()

        async def run(conn: psycopg.AsyncConnection[Any]) -> None:
            tx = _PgTx(conn)
            if await tx.fetchone("SELECT 1 FROM image_blobs WHERE digest = :d", {"d": digest}):
                return
            h = hashlib.sha256()
            seq = size = 0
            with source.open("rb") as f:
                while data := await asyncio.to_thread(f.read, self.chunk):
                    h.update(data)
                    # A concurrent put of the same digest waits here on the key until the other
                    # commits (then writes nothing) or rolls back (then this one writes it).
                    await tx.execute(
                        "INSERT INTO image_chunks (digest, seq, data) VALUES (:d, :s, :b) "
                        "ON CONFLICT DO NOTHING",
                        {"d": digest, "s": seq, "b": data},
                    )
                    seq += 1
                    size += len(data)
            if f"sha256:{h.hexdigest()}" != digest:
                raise ValueError(f"bytes of {source.name} do not hash to {digest}")  # rolls back
            await tx.execute(
                "INSERT INTO image_blobs (digest, size, chunks, created_at) VALUES (:d, :n, :c, :now) "
                "ON CONFLICT DO NOTHING",
                {"d": digest, "n": size, "c": seq, "now": now},
            )

        await self.store._transaction(run)

    async def _row(self, digest: str) -> tuple[int, int] | None:
        check_digest(digest)
        row = await self.store._read(
            lambda tx: tx.fetchone("SELECT size, chunks FROM image_blobs WHERE digest = :d", {"d": digest})
        )
        return None if row is None else (int(row[0]), int(row[1]))

    async def has(self, digest: str) -> bool:
        return await self._row(digest) is not None

    async def size(self, digest: str) -> int:
        row = await self._row(digest)
        if row is None:
            raise BlobNotFound(digest)
        return row[0]

    async def read(self, digest: str) -> AsyncIterator[bytes]:
        row = await self._row(digest)
        if row is None:
            raise BlobNotFound(digest)
        for seq in range(row[1]):
            got = await self.store._read(
                lambda tx, seq=seq: tx.fetchone(  # type: ignore[misc]
                    "SELECT data FROM image_chunks WHERE digest = :d AND seq = :s", {"d": digest, "s": seq}
                )
            )
            if got is None:  # deleted while this stream read it
                raise BlobNotFound(digest)
            yield bytes(got[0])

    async def delete(self, digest: str) -> None:
        check_digest(digest)

        async def run(conn: psycopg.AsyncConnection[Any]) -> None:
            tx = _PgTx(conn)
            await tx.execute("DELETE FROM image_blobs WHERE digest = :d", {"d": digest})
            await tx.execute("DELETE FROM image_chunks WHERE digest = :d", {"d": digest})

        await self.store._transaction(run)

    async def digests(self) -> list[str]:
        got = await self.store._read(lambda tx: tx.fetchall("SELECT digest FROM image_blobs ORDER BY digest"))
        return [str(r[0]) for r in got]
