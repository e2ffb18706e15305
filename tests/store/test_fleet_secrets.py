"""Secrets every replica shares: made once by the first caller, the same for every later one."""

from __future__ import annotations

import asyncio

import pytest

from corral.store import InvalidRecord, Store, open_store


async def test_a_fleet_secret_is_made_once_and_read_alike(store: Store, store_url: str) -> None:
    first = await store.fleet_secret("e2b-access")
    assert len(first) >= 32
    assert await store.fleet_secret("e2b-access") == first
    assert await store.fleet_secret("another") != first
    # Another replica on the same store, and several callers at once, all read the one secret.
    other = open_store(store_url)
    try:
        got = await asyncio.gather(
            *(other.fleet_secret("racing") for _ in range(8)), store.fleet_secret("racing")
        )
        assert len(set(got)) == 1
        assert await other.fleet_secret("e2b-access") == first
    finally:
        await other.close()
    with pytest.raises(InvalidRecord):
        await store.fleet_secret("")
