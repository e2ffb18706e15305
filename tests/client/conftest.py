from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import pytest

from corral.client import AsyncCorral, Corral, RetryPolicy

from .fakes import FakeApi, FakeTime

POLICY = RetryPolicy(base_s=0.25, cap_s=8.0, deadline_s=30.0)


@pytest.fixture
def fake_time() -> FakeTime:
    return FakeTime()


@pytest.fixture
def api(fake_time: FakeTime) -> FakeApi:
    return FakeApi(time=fake_time)


@pytest.fixture
def client(api: FakeApi, fake_time: FakeTime) -> Iterator[Corral]:
    with Corral(
        "http://corral.test",
        "t0k",
        transport=api.transport,
        retry=POLICY,
        clock=fake_time.clock,
        sleep=fake_time.sleep,
        rng=random.Random(7),
    ) as c:
        yield c


@pytest.fixture
async def aclient(api: FakeApi, fake_time: FakeTime) -> AsyncIterator[AsyncCorral]:
    async with AsyncCorral(
        "http://corral.test",
        "t0k",
        transport=api.transport,
        retry=POLICY,
        clock=fake_time.clock,
        sleep=fake_time.async_sleep,
        rng=random.Random(7),
    ) as c:
        yield c
