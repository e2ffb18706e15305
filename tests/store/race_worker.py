"""One racing writer process for ``test_race.py``: ``python race_worker.py URL INDEX OPS SEED ROLE``.

It opens its own store and makes OPS reservation attempts (single, best-of-2 and batches of 3) on the
race's hosts, ending a random held reservation now and then (confirm or cancel), leaving some to
expire. ROLE ``heartbeat`` also publishes heartbeats that confirm reservations by sandbox id, ``sweep``
also sweeps, and ``die`` exits without ending anything (its lease must end them). Prints one JSON line
of counts.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time

from corral.core import AdmissionMode, HostFacts
from corral.store import HostReport, Listing, ReserveItem, open_store

HOSTS = [f"h{i:02d}" for i in range(12)]
ADMITTABLE = 6000
SHORT_TTL_S = 0.3
LONG_TTL_S = 300.0
LEASE_S = 1.0


async def main(url: str, index: int, ops: int, seed: int, role: str) -> dict[str, int]:
    rng = random.Random(seed)
    owner = f"w{index}"
    store = open_store(url)
    stats = {
        "reserved": 0,
        "refused": 0,
        "confirmed": 0,
        "cancelled": 0,
        "already_ended": 0,
        "confirmed_by_heartbeat": 0,
        "swept": 0,
    }
    held: list[str] = []
    await store.renew_replica(owner, LEASE_S if role == "die" else 600.0)

    async def end_one() -> None:
        rid = held.pop(rng.randrange(len(held)))
        if rng.random() < 0.5:
            ok = await store.confirm(rid)
            stats["confirmed" if ok else "already_ended"] += 1
        else:
            ok = await store.cancel(rid)
            stats["cancelled" if ok else "already_ended"] += 1

    for i in range(ops):
        short = rng.random() < 0.25
        ttl = SHORT_TTL_S if short else LONG_TTL_S
        sid = f"{owner}-{i}"
        kind = rng.random()
        if kind < 0.6:
            got = await store.reserve(
                rng.choice(HOSTS),
                memory_mb=rng.randint(200, 1200),
                cpu=0.25,
                owner=owner,
                ttl_s=ttl,
                sandbox_id=sid,
            )
            made = [got] if got is not None else None
        elif kind < 0.85:
            got = await store.reserve_best(
                rng.sample(HOSTS, 2), memory_mb=rng.randint(200, 1200), owner=owner, ttl_s=ttl, sandbox_id=sid
            )
            made = [got] if got is not None else None
        else:
            items = [
                ReserveItem(rng.choice(HOSTS), rng.randint(100, 600), 0.1, f"{sid}.{k}") for k in range(3)
            ]
            made = await store.reserve_batch(items, owner=owner, ttl_s=ttl)
        if made is None:
            stats["refused"] += 1
        else:
            stats["reserved"] += len(made)
            if not short:
                held.extend(r.id for r in made)
        if role != "die" and held and rng.random() < 0.45:
            await end_one()
        if role == "heartbeat" and i % 20 == 0:
            # Show a handful of recent sandboxes of every writer on one host: whichever of them hold a
            # reservation there are confirmed by it.
            shown = frozenset(f"w{w}-{j}" for w in range(8) for j in range(max(0, i - 40), i))
            hb = HostReport(
                host_id=rng.choice(HOSTS),
                seq=time.time_ns(),
                facts=HostFacts(
                    cpu_total=64.0,
                    cpu_used=0.0,
                    memory_mb_total=ADMITTABLE + 2048,
                    memory_mb_used=0,
                    memory_mb_admittable=ADMITTABLE,
                    memory_admission=AdmissionMode.COMMITTED,
                ),
                listing=Listing(None, dict.fromkeys(shown, 0)),
            )
            stats["confirmed_by_heartbeat"] += (await store.upsert_heartbeat(hb)).confirmed
        if role == "sweep" and i % 25 == 0:
            stats["swept"] += await store.sweep_expired()
    if role == "die":
        print(json.dumps(stats), flush=True)
        os._exit(0)  # a crash: no cleanup, no close, the lease simply stops being renewed
    while held:
        await end_one()
    await store.close()
    return stats


if __name__ == "__main__":
    url, index, ops, seed, role = (
        sys.argv[1],
        int(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        sys.argv[5],
    )
    print(json.dumps(asyncio.run(main(url, index, ops, seed, role))), flush=True)
