"""The race: 8 processes x 500 reservations on 12 hosts, against each backend. Every host is
oversubscribed many times over, so writers fight over the last room all the time.

Observed throughout by a checker in this process: no host ever has more live reservations than its
admittable allows, and the books balance (``hosts.reserved_*`` equals the sum of the reservation rows).
At the end, after confirms, cancels, heartbeat confirms, expiry and a crashed writer's lease lapsing,
nothing is outstanding.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from corral.store import Store, open_store

from . import race_worker
from .helpers import beat

WRITERS = 8
OPS = 500
ROLES = {5: "sweep", 6: "heartbeat", 7: "die"}


async def _checker(store: Store, done: asyncio.Event) -> dict[str, int]:
    seen = {"observations": 0, "max_reserved_mb": 0}
    while not done.is_set():
        for host in await store.list_hosts():
            assert host.reserved_mb <= host.memory_mb_admittable, f"over-admitted: {host}"
            seen["max_reserved_mb"] = max(seen["max_reserved_mb"], host.reserved_mb)
        assert await store.audit() == []
        seen["observations"] += 1
        await asyncio.sleep(0.005)
    return seen


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_eight_processes_never_overbook_and_leave_nothing_behind(store_url: str) -> None:
    store = open_store(store_url)
    await store.migrate()
    try:
        for h in race_worker.HOSTS:
            await store.upsert_heartbeat(
                beat(h, 1, admittable=race_worker.ADMITTABLE, total=race_worker.ADMITTABLE + 2048)
            )
        done = asyncio.Event()
        checker = asyncio.create_task(_checker(store, done))
        script = str(Path(race_worker.__file__))
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable,
                script,
                store_url + ("&pool_size=2" if store_url.startswith("postgres") else ""),
                str(i),
                str(OPS),
                str(1000 + i),
                ROLES.get(i, "plain"),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            for i in range(WRITERS)
        ]
        outs = [await p.communicate() for p in procs]
        done.set()
        seen = await checker
        assert [p.returncode for p in procs] == [0] * WRITERS, [err.decode()[-2000:] for _, err in outs]
        stats = [json.loads(out) for out, _ in outs]
        total = {k: sum(s[k] for s in stats) for k in stats[0]}

        # The race was a real one: room ran out, writers were refused, and the checker watched it.
        assert total["reserved"] > 0 and total["refused"] > 0
        assert seen["observations"] >= 3
        assert seen["max_reserved_mb"] > race_worker.ADMITTABLE - 1200

        # The crashed writer still holds its reservations until its lease lapses.
        time.sleep(max(race_worker.LEASE_S, race_worker.SHORT_TTL_S) + 0.05)
        assert "w7" in await store.expire_replicas()
        await store.sweep_expired()
        assert await store.outstanding() == {}
        assert await store.next_expiry() is None
        assert all(h.reserved_mb == 0 and h.reserved_cpu == 0 for h in await store.list_hosts())
        assert await store.audit() == []
    finally:
        await store.close()
