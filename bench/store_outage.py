"""How fast a ``corral api`` answers while its PostgreSQL is cut off, and how soon it works again.
JSON lines, one per measurement, each beside the same request's latency with the store up.

    .venv/bin/python bench/store_outage.py [--cycles 3]

PostgreSQL comes from ``CORRAL_TEST_POSTGRES_URL`` (default the local test database), reached through a
TCP proxy the benchmark cuts (refuses new connections, breaks open ones) and restores. The fleet has
no hosts: with the store up a create answers 503 ``no_healthy_hosts``, with it down 503
``store_unavailable``, so the answer's code says which side of the outage a request saw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psycopg
from psycopg import sql

from corral.testing import CuttableProxy

TOKEN = "bench-admin-token-0123456789"
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(client: httpx.Client, method: str, path: str) -> tuple[float, int, str]:
    began = time.perf_counter()
    r = client.request(method, path, json={} if method == "POST" else None)
    ms = (time.perf_counter() - began) * 1000.0
    code = r.json().get("error", {}).get("code", "") if r.status_code >= 400 else ""
    return ms, r.status_code, code


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "first_ms": round(samples[0], 1),
        "p50_ms": round(statistics.median(samples), 1),
        "max_ms": round(max(samples), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()

    base = httpx.URL(os.environ.get("CORRAL_TEST_POSTGRES_URL", DEFAULT_PG))
    schema = f"bench_outage_{os.getpid()}"
    proxy = CuttableProxy((base.host or "127.0.0.1", base.port or 5432))
    proxy.up()
    user = base.userinfo.decode() or "postgres"
    store_url = f"postgresql://{user}@127.0.0.1:{proxy.port}{base.path}?schema={schema}"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "api.log", "wb")  # noqa: SIM115 (closed below)
        server = subprocess.Popen(
            [sys.executable, "-m", "corral", "api", "--store", store_url, "--port", str(port)],
            env={**{k: v for k, v in os.environ.items() if k != "CORRAL_AGENT_TOKEN"}, "CORRAL_TOKEN": TOKEN},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    raise SystemExit(
                        f"corral api did not start: {(Path(tmp) / 'api.log').read_text()[-2000:]}"
                    )
                time.sleep(0.1)
            up_create = [timed(client, "POST", "/v1/sandboxes")[0] for _ in range(args.requests)]
            up_ready = [timed(client, "GET", "/readyz")[0] for _ in range(args.requests)]
            for cycle in range(args.cycles):
                proxy.down()
                creates = [timed(client, "POST", "/v1/sandboxes") for _ in range(args.requests)]
                readies = [timed(client, "GET", "/readyz") for _ in range(args.requests)]
                assert all(c == 503 and code == "store_unavailable" for _, c, code in creates), creates[:3]
                assert all(c == 503 for _, c, _code in readies), readies[:3]
                proxy.up()
                restored = time.perf_counter()
                while timed(client, "POST", "/v1/sandboxes")[2] == "store_unavailable":
                    time.sleep(0.01)
                recovered_s = time.perf_counter() - restored
                for name, got, up in (("create", creates, up_create), ("readyz", readies, up_ready)):
                    line = {
                        "bench": "store_outage",
                        "cycle": cycle,
                        "request": name,
                        "store_down": summary([ms for ms, _c, _code in got]),
                        "store_up_p50_ms": round(statistics.median(up), 1),
                    }
                    print(json.dumps(line), flush=True)
                print(
                    json.dumps(
                        {"bench": "store_outage", "cycle": cycle, "recovered_after_s": round(recovered_s, 3)}
                    ),
                    flush=True,
                )
        finally:
            server.terminate()
            server.wait(10)
            log.close()
            proxy.down()
            with psycopg.connect(str(base), autocommit=True) as conn:
                conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


if __name__ == "__main__":
    main()
