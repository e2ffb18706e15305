"""How long a revoked token keeps working on another replica, and what following revocations costs on
the hot path. Two control planes share one store (PostgreSQL when reachable, else a SQLite file);
one revokes, the other is polled until it refuses. One JSON object per line.

    .venv/bin/python bench/revocation.py [--rounds 20] [--store URL]

``auth_cached``: one authentication served from the cache, with the revocation epoch polled as a
replica does, beside ``auth_store``: the same answer read from the store every time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from random import Random

from corral.clock import SystemClock
from corral.control.agents import LocalAgents
from corral.control.config import ControlConfig
from corral.control.errors import Unauthorized
from corral.control.plane import REVOCATION_POLL_S, build_replica
from corral.store import open_store


async def main(rounds: int, url: str) -> None:
    a = build_replica(
        open_store(url), LocalAgents(), ControlConfig(replica_id="bench-a"), SystemClock(), Random()
    )
    b = build_replica(
        open_store(url), LocalAgents(), ControlConfig(replica_id="bench-b"), SystemClock(), Random()
    )
    await a.start(admin_token="bench-revocation-admin-token")
    await b.start(admin_token="bench-revocation-admin-token")
    try:
        admin = await a.authenticate("bench-revocation-admin-token")
        lags = []
        for i in range(rounds):
            _, token = await a.create_tenant(f"bench-{time.time_ns()}-{i}", 10, 10_000)
            who = await b.authenticate(token)  # b caches it
            await a.revoke_token(who.token_id, admin)
            t0 = time.perf_counter()
            while True:
                try:
                    await b.authenticate(token)
                except Unauthorized:
                    break
                await asyncio.sleep(0.005)
            lags.append(time.perf_counter() - t0)
        print(
            json.dumps(
                {
                    "bench": "revocation_lag",
                    "store": url.split(":")[0],
                    "rounds": rounds,
                    "poll_s": REVOCATION_POLL_S,
                    "p50_ms": round(statistics.median(lags) * 1000, 1),
                    "max_ms": round(max(lags) * 1000, 1),
                }
            )
        )
        n = 20_000
        for name, reset in (("auth_cached", False), ("auth_store", True)):
            t0 = time.perf_counter()
            for _ in range(n):
                if reset:
                    b._tokens.clear()
                await b.authenticate("bench-revocation-admin-token")
            per = (time.perf_counter() - t0) / n
            print(
                json.dumps(
                    {"bench": name, "store": url.split(":")[0], "n": n, "us_per_call": round(per * 1e6, 2)}
                )
            )
    finally:
        for p in (a, b):
            await p.stop()
            await p.store.close()


def _default_store() -> str:
    try:
        import psycopg

        from tests.pg import new_schema_name, pg_base_url, with_schema

        base = pg_base_url()
        with psycopg.connect(base, connect_timeout=3):
            pass
        return with_schema(base, new_schema_name("corral_bench"))
    except Exception:
        return f"sqlite:///{tempfile.mkdtemp()}/bench.db"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    asyncio.run(main(args.rounds, args.store or _default_store()))
