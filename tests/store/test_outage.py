"""A store known to be down fails at once, probes for its return, and starts over on fresh connections."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from corral.core import ManualClock
from corral.store import StoreUnavailable
from corral.store.outage import Breaker
from corral.store.postgres import PostgresStore
from corral.testing import CuttableProxy
from tests.pg import with_schema

from .helpers import beat


async def _until(cond: Callable[[], bool]) -> None:
    for _ in range(600):
        if cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


async def test_an_unconfirmed_failure_opens_nothing() -> None:
    probes: list[int] = []

    async def probe() -> None:
        probes.append(1)  # the server answers

    async def renew() -> None:
        raise AssertionError("nothing to recover from")

    breaker = Breaker(probe, renew, ManualClock(0.0), interval_s=0.001)
    breaker.suspect(OSError("server closed the connection unexpectedly"))
    await _until(lambda: bool(probes))
    await asyncio.sleep(0.01)
    assert not breaker.is_open and breaker.trips == 0
    breaker.check()
    await breaker.close()


async def test_breaker_fails_fast_while_open_and_closes_on_the_first_good_probe() -> None:
    clock = ManualClock(100.0)
    server_back = asyncio.Event()
    probes: list[bool] = []
    recovered: list[float] = []

    async def probe() -> None:
        probes.append(server_back.is_set())
        if not server_back.is_set():
            raise OSError("connection refused")

    async def renew() -> None:
        recovered.append(clock.now())

    breaker = Breaker(probe, renew, clock, interval_s=0.001)
    breaker.check()  # closed: nothing happens
    breaker.suspect(OSError("connection refused"))
    breaker.suspect(OSError("again"))  # already probing: no second probe
    await _until(lambda: breaker.is_open)
    assert breaker.trips == 1 and breaker.reason == "connection refused"
    clock.advance(2.5)
    with pytest.raises(StoreUnavailable, match=r"unreachable for 2\.5s \(connection refused\)"):
        breaker.check()
    assert breaker.refused == 1
    await _until(lambda: len(probes) >= 3)  # it keeps probing while the server is away
    server_back.set()
    await _until(lambda: not breaker.is_open)
    assert probes[-1] is True and not any(probes[:-1])
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
    # The first call finds the server gone (its connection was cut); a probe confirms it and opens.
    with pytest.raises(StoreUnavailable):
        for _ in range(3):  # a read rides over one dead connection; its retry finds none
            await store.ping()
    await _until(lambda: store.breaker.is_open)
    # Every later call is refused by the breaker itself, without waiting on the pool.
    refused = store.breaker.refused
    for call in (store.ping(), store.upsert_heartbeat(beat("h00", 2)), store.list_hosts()):
        with pytest.raises(StoreUnavailable, match="probing for its return"):
            await call
    assert store.breaker.refused == refused + 3
    proxy.up()
    await _until(lambda: not store.breaker.is_open)
    assert store.breaker.recoveries == 1
    # Writes work again at once, on connections made after the outage.
    result = await store.upsert_heartbeat(beat("h00", 3))
    assert result.accepted and result.host.seq == 3
