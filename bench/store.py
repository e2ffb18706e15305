"""Reservation throughput of the state of record: reservations per second and p50/p99 latency, for
single reservations with 1, 4 and 8 concurrent writers and for batches of 50, on SQLite and on
PostgreSQL. One JSON object per line.

    .venv/bin/python bench/store.py [--seconds 3] [--phase 0.25] [--hosts 12] [--backends sqlite,postgres]

Each writer is its own process with its own store (as replicas are). The raw ceiling is measured in the
same run by the same processes: the very same conditional statements issued by a bare driver loop with
no corral code (psycopg / sqlite3, one connection per writer). All writers switch between the raw loop
and corral together, on a shared wall-clock schedule of short phases, so both sides meet the same
background load (this machine is shared) and ``ratio`` reads corral's own overhead, not the noise.
PostgreSQL comes from ``CORRAL_TEST_POSTGRES_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``)
and runs in a fresh schema dropped afterwards; SQLite in a fresh temporary file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import secrets
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql as pgsql

from corral.core import AdmissionMode, HostFacts
from corral.store import HostReport, ReserveItem, Store, open_store
from corral.store.postgres import _RESERVE, _RESERVE_BATCH
from corral.store.sql import SqlStore

DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
BATCH = 50
# Room for everything a run can reserve, memory and CPU: the condition is evaluated by every statement
# and always holds.
ADMITTABLE = 10**15
TTL_S = 3600.0
MB = 512


def host_ids(n: int) -> list[str]:
    return [f"host-{i:05d}" for i in range(n)]


def pg_parts(url: str) -> tuple[str, str]:
    """(libpq URL without corral's parameters, schema)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    schema = query.pop("schema", "public")
    query.pop("pool_size", None)
    return urlunsplit(parts._replace(query=urlencode(query))), schema


# -- the raw ceiling: a bare driver loop -----------------------------------------------------------


def raw_pg(url: str, mode: str, hosts: list[str], rng: random.Random) -> Callable[[], int]:
    base, schema = pg_parts(url)
    conn = psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}")
    owner = f"raw-{os.getpid()}"

    def single() -> int:
        now = time.time()
        p = {
            "id": uuid.uuid4().hex,
            "h": rng.choice(hosts),
            "mb": MB,
            "cpu": 1000,
            "owner": owner,
            "sid": None,
        }
        if conn.execute(_RESERVE, {**p, "now": now, "exp": now + TTL_S}).fetchone() is None:
            raise SystemExit("a raw reservation was refused")
        return 1

    def batch() -> int:
        now = time.time()
        chosen = [rng.choice(hosts) for _ in range(BATCH)]
        need: dict[str, int] = {}
        for h in chosen:
            need[h] = need.get(h, 0) + MB
        hs = sorted(need)
        params = {
            "hids": hs,
            "hmb": [need[h] for h in hs],
            "hcpu": [need[h] * 1000 // MB for h in hs],
            "nhosts": len(hs),
            "rids": [uuid.uuid4().hex for _ in chosen],
            "rhosts": chosen,
            "rmb": [MB] * BATCH,
            "rcpu": [1000] * BATCH,
            "rsids": [None] * BATCH,
            "owner": owner,
            "now": now,
            "exp": now + TTL_S,
        }
        got = conn.execute(_RESERVE_BATCH, params).fetchone()
        if got is None or not got[0]:
            raise SystemExit("a raw batch was refused")
        return BATCH

    return single if mode == "single" else batch


def raw_sqlite(url: str, mode: str, hosts: list[str], rng: random.Random) -> Callable[[], int]:
    conn = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None, timeout=30)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA synchronous = NORMAL")
    owner = f"raw-{os.getpid()}"
    take, insert = SqlStore._TAKE, SqlStore._INSERT
    n = 1 if mode == "single" else BATCH

    def op() -> int:
        now = time.time()
        picks = [rng.choice(hosts) for _ in range(n)]
        need: dict[str, int] = {}
        for h in picks:
            need[h] = need.get(h, 0) + MB
        conn.execute("BEGIN IMMEDIATE")
        for h in sorted(need):
            if conn.execute(take, {"h": h, "mb": need[h], "cpu": need[h] * 1000 // MB}).fetchone() is None:
                raise SystemExit("a raw reservation was refused")
        rows = [
            {
                "id": uuid.uuid4().hex,
                "h": h,
                "mb": MB,
                "cpu": 1000,
                "owner": owner,
                "sid": None,
                "now": now,
                "exp": now + TTL_S,
            }
            for h in picks
        ]
        conn.executemany(insert, rows)
        conn.execute("COMMIT")
        return n

    return op


# -- corral ----------------------------------------------------------------------------------------


async def corral_op(store: Store, mode: str, hosts: list[str], rng: random.Random, owner: str) -> int:
    if mode == "single":
        if await store.reserve(rng.choice(hosts), memory_mb=MB, cpu=1.0, owner=owner, ttl_s=TTL_S) is None:
            raise SystemExit("a reservation was refused: the bench fleet must have room for everything")
        return 1
    items = [ReserveItem(rng.choice(hosts), MB, 1.0) for _ in range(BATCH)]
    if await store.reserve_batch(items, owner=owner, ttl_s=TTL_S) is None:
        raise SystemExit("a batch was refused: the bench fleet must have room for everything")
    return BATCH


# -- one writer process: alternate phases on the shared schedule ----------------------------------


async def writer(spec: dict[str, Any]) -> dict[str, Any]:
    url, corral_url, mode, hosts = spec["url"], spec["corral_url"], spec["mode"], spec["hosts"]
    rng = random.Random(os.getpid())
    raw = (raw_sqlite if url.startswith("sqlite:") else raw_pg)(url, mode, hosts, rng)
    store = open_store(corral_url)
    await store.ping()
    owner = f"corral-{os.getpid()}"
    out: dict[str, Any] = {"raw": {"done": 0, "lat": []}, "corral": {"done": 0, "lat": []}}
    for phase in range(spec["phases"]):
        begin = spec["start_at"] + phase * spec["phase_s"]
        end = begin + spec["phase_s"]
        await asyncio.sleep(max(0.0, begin - time.time()))
        # Alternate which side goes first in each pair of phases, so neither always follows the other.
        kind = "raw" if phase % 4 in (0, 3) else "corral"
        acc = out[kind]
        while time.time() < end:
            t0 = time.perf_counter()
            n = raw() if kind == "raw" else await corral_op(store, mode, hosts, rng, owner)
            acc["lat"].append(time.perf_counter() - t0)
            acc["done"] += n
    await store.close()
    return out


# -- the run ---------------------------------------------------------------------------------------


def run_config(
    url: str, corral_url: str, mode: str, writers: int, hosts: list[str], seconds: float, phase_s: float
) -> dict[str, dict[str, float]]:
    phases = 2 * max(1, round(seconds / phase_s))
    phases += -phases % 4  # whole raw/corral/corral/raw cycles
    spec = {
        "url": url,
        "corral_url": corral_url,
        "mode": mode,
        "hosts": hosts,
        "start_at": time.time() + 1.5,  # every writer imported and connected before the clock starts
        "phase_s": phase_s,
        "phases": phases,
    }
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", json.dumps(spec)], stdout=subprocess.PIPE, text=True
        )
        for _ in range(writers)
    ]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a writer failed")
    results = [json.loads(o) for o in outs]
    per_side = phases // 2 * phase_s
    summary = {}
    for kind in ("raw", "corral"):
        lat = sorted(x for r in results for x in r[kind]["lat"])
        summary[kind] = {
            "per_s": sum(r[kind]["done"] for r in results) / per_side,
            "p50_ms": lat[len(lat) // 2] * 1000 if lat else 0.0,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else 0.0,
        }
    return summary


async def prepare(url: str, hosts: list[str]) -> None:
    store = open_store(url)
    await store.migrate()
    for h in hosts:
        await store.upsert_heartbeat(
            HostReport(
                h, 1, HostFacts(float(ADMITTABLE), 0.0, ADMITTABLE, 0, ADMITTABLE, AdmissionMode.COMMITTED)
            )
        )
    await store.close()


def reset(url: str) -> None:
    """Empty the books between configurations, so each starts from the same table sizes."""
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None) as conn:
            conn.execute("DELETE FROM reservations")
            conn.execute("UPDATE hosts SET reserved_mb = 0, reserved_cpu_m = 0")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return
    base, schema = pg_parts(url)
    with psycopg.connect(base, autocommit=True, options=f"-c search_path={schema}") as conn:
        conn.execute("TRUNCATE reservations")
        conn.execute("UPDATE hosts SET reserved_mb = 0, reserved_cpu_m = 0")
        conn.execute("VACUUM ANALYZE hosts")


def bench_backend(backend: str, url: str, hosts: list[str], seconds: float, phase_s: float) -> None:
    asyncio.run(prepare(url, hosts))
    # A writer runs one reservation at a time: one pooled connection is all it uses.
    corral_url = url + ("&pool_size=1" if backend == "postgres" else "")
    for mode, writer_counts in (("single", (1, 4, 8)), ("batch50", (1, 4, 8))):
        for writers in writer_counts:
            reset(url)
            got = run_config(
                url, corral_url, "single" if mode == "single" else "batch", writers, hosts, seconds, phase_s
            )
            ours, ceiling = got["corral"], got["raw"]
            line = {
                "bench": "store",
                "backend": backend,
                "mode": mode,
                "writers": writers,
                "hosts": len(hosts),
                "per_s": round(ours["per_s"], 1),
                "ceiling_per_s": round(ceiling["per_s"], 1),
                "ratio": round(ours["per_s"] / ceiling["per_s"], 3) if ceiling["per_s"] else 0.0,
                "p50_ms": round(ours["p50_ms"], 3),
                "p99_ms": round(ours["p99_ms"], 3),
                "ceiling_p50_ms": round(ceiling["p50_ms"], 3),
                "ceiling_p99_ms": round(ceiling["p99_ms"], 3),
            }
            print(json.dumps(line), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=3.0, help="measured time per configuration and side")
    ap.add_argument("--phase", type=float, default=0.25, help="length of one raw or corral phase")
    ap.add_argument("--hosts", type=int, default=12, help="hosts in the bench fleet")
    ap.add_argument("--backends", default="sqlite,postgres")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(asyncio.run(writer(json.loads(args.worker)))))
        return
    hosts = host_ids(args.hosts)
    for backend in args.backends.split(","):
        if backend == "sqlite":
            with tempfile.TemporaryDirectory(prefix="corral-bench-") as tmp:
                bench_backend(
                    "sqlite", f"sqlite:///{Path(tmp) / 'bench.db'}", hosts, args.seconds, args.phase
                )
        elif backend == "postgres":
            base = os.environ.get("CORRAL_TEST_POSTGRES_URL", DEFAULT_PG)
            schema = f"corral_bench_{secrets.token_hex(4)}"
            try:
                url = f"{base}{'&' if '?' in base else '?'}schema={schema}"
                bench_backend("postgres", url, hosts, args.seconds, args.phase)
            finally:
                with psycopg.connect(pg_parts(base)[0], autocommit=True) as conn:
                    conn.execute(
                        pgsql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(pgsql.Identifier(schema))
                    )
        else:
            raise SystemExit(f"unknown backend {backend!r}")


if __name__ == "__main__":
    main()
