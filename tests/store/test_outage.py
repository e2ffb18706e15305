"""A store known to be down fails at once, probes for its return, and starts over on fresh connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from corral.core import ManualClock
from corral.store import StoreUnavailable
from corral.store.outage import Breaker
from corral.store.postgres import PostgresStore
from corral.testing import CuttableProxy
from tests.pg import with_schema

from .helpers import beat


async def test_breaker_fails_fast_while_open_and_closes_on_the_first_good_probe() -> None:
    clock = ManualClock(100.0)
    answers = [False, False, True]
    probes: list[bool] = []
    recovered: list[float] = []

    async def probe() -> None:
        ok = answers[len(probes)]
        probes.append(ok)
        if not ok:
            raise OSError("connection refused")

    async def renew() -> None:
        recovered.append(clock.now())

    breaker = Breaker(probe, renew, clock, interval_s=0.001)
    breaker.check()  # closed: nothing happens
    breaker.trip(OSError("connection refused"))
    breaker.trip(OSError("again"))  # already open: no second probe, same reason
    assert breaker.is_open and breaker.trips == 1 and breaker.reason == "connection refused"
    clock.advance(2.5)
    with pytest.raises(StoreUnavailable, match=r"unreachable for 2\.5s \(connection refused\)"):
        breaker.check()
    assert breaker.refused == 1
    for _ in range(200):
        if not breaker.is_open:
            break
        await asyncio.sleep(0.005)
    assert probes == [False, False, True]
    assert recovered == [102.5] and breaker.recoveries == 1
    breaker.check()
    await breaker.close()


@pytest.fixture
async def cut_store(pg_server: str, pg_schema: str) -> AsyncIterator[tuple[PostgresStore, CuttableProxy]]:
    target = httpx.URL(pg_server)
    proxy = CuttableProxy((target.host or "127.0.0.1", target.port or 5432))
    proxy.up()
    user = target.userinfo.decode() or "postgres"
    url = with_schema(f"postgresql://{user}@127.0.0.1:{proxy.port}{target.path}", pg_schema)
    store = PostgresStore.from_url(url)
    await store.migrate()
    try:
        yield store, proxy
    finally:
        await store.close()
        proxy.down()


@pytest.mark.postgres
async def test_a_cut_store_fails_fast_then_recovers_on_a_fresh_pool(
    cut_store: tuple[PostgresStore, CuttableProxy],
) -> None:
    store, proxy = cut_store
    await store.upsert_heartbeat(beat("h00", 1))
    proxy.down()
    # The first call finds the server gone (its connection was cut) and opens the breaker.
    with pytest.raises(StoreUnavailable):
        for _ in range(3):  # a read rides over one dead connection; its retry finds none
            await store.ping()
    assert store.breaker.is_open
    # Every later call is refused by the breaker itself, without waiting on the pool.
    refused = store.breaker.refused
    for call in (store.ping(), store.upsert_heartbeat(beat("h00", 2)), store.list_hosts()):
        with pytest.raises(StoreUnavailable, match="probing for its return"):
            await call
    assert store.breaker.refused == refused + 3
    proxy.up()
    for _ in range(600):
        if not store.breaker.is_open:
            break
        await asyncio.sleep(0.05)
    assert not store.breaker.is_open and store.breaker.recoveries == 1
    # Writes work again at once, on connections made after the outage.
    result = await store.upsert_heartbeat(beat("h00", 3))
    assert result.accepted and result.host.seq == 3
