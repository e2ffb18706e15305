"""Sandbox networks, measured side by side in one run (root, iproute2 and nftables; JSON lines):

* ``slot``: a slot taken from the agent's pool (built ahead) beside one built on demand (the pool
  drained), p50/p99 of ``SlotPool.take`` (bar: pooled p50 <= 1 ms); and beside them the same
  policy transaction a take makes, through the ``nft -f`` command (how takes loaded it before
  libnftables: the command's start was the 18 ms a pooled take cost);
* ``port``: ``corral serve`` with one process host; a server in a sandbox (corral.testing.portserver);
  the same ``GET /hello`` over one kept-alive connection direct to the sandbox's slot address and
  through the replica by Host, interleaved, p50/p99 and the proxied overhead (bar: p50 <= 1 ms).
  Both clients and the server send without Nagle's delay (TCP_NODELAY), as the replica's own
  sockets do (asyncio's): a server that writes its headers and its body apart otherwise waits for
  the headers' ACK, which the reader's delayed ACK holds up to 40 ms, and one path or the other
  measured that stall rather than the proxy;
* ``policy``: ``PUT /v1/sandboxes/{id}/network`` on the running sandbox, end to end (the replica,
  the agent's nft transaction, the record), p50/p99 (bar: <= 50 ms);
* ``tables``: what slots cost the rest of the host: a TCP round trip on its loopback (as the
  control plane's, PostgreSQL's) with no slot table loaded, beside the same with ``--tables`` of
  them (each its own base chains, which every packet of the host passes through).

    .venv/bin/python bench/network.py [--requests 2000] [--slots 40] [--updates 40]
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api import free_port, wait_ready

from corral.agent import netns
from corral.agent.netslots import SlotPool
from corral.core.netpolicy import INTERNET, delete_table, render_policy, render_table, slot_count, slot_net
from corral.testing.portserver import start_argv

TOKEN = "bench-network-token-0123456789"
PORT = 8080
_ADDRESS = "import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect(('198.51.100.1', 9)); print(s.getsockname()[0])"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summary(samples_s: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples_s]
    return {"p50_ms": round(statistics.median(ms), 3), "p99_ms": round(pct(ms, 0.99), 3), "n": len(ms)}


async def slots(n: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        pooled, built, command = [], [], []
        # Leases of its own, so a range of its own: a pool removes the slots of its range that no
        # lease of its directory accounts for, and the default range is the machine's agents'.
        leases, own = Path(tmp) / "leases", ipaddress.IPv4Network("10.233.0.0/24")
        pool = SlotPool(Path(tmp) / "pool", size=1, lease_dir=leases, slot_range=own)
        drained = SlotPool(Path(tmp) / "drained", size=0, lease_dir=leases, slot_range=own)
        try:
            for i in range(n):
                await pool.fill()  # ready ahead, as the pool's background filler keeps it
                t = time.perf_counter()
                slot = await pool.take(f"p{i}", INTERNET)
                pooled.append(time.perf_counter() - t)
                t = time.perf_counter()
                subprocess.run(["nft", "-f", "-"], input=render_policy(slot, INTERNET), text=True, check=True)
                command.append(time.perf_counter() - t)
                t = time.perf_counter()
                await drained.take(f"d{i}", INTERNET)
                built.append(time.perf_counter() - t)
                await pool.give_back(f"p{i}")
                await drained.give_back(f"d{i}")
        finally:
            for p in (pool, drained):
                for sid in list(p.in_use):
                    await p.give_back(sid)
                await p.close()
    return [
        {"bench": "network.slot", "kind": "pooled", **summary(pooled)},
        {"bench": "network.slot", "kind": "on_demand", **summary(built)},
        {"bench": "network.slot", "kind": "policy_by_nft_command", **summary(command)},
    ]


def _nodelay() -> httpx.HTTPTransport:
    return httpx.HTTPTransport(socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])


def ports(requests: int, updates: int) -> list[dict[str, Any]]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        args = ["serve", "--runtime", "process", "--hosts", "1", "--port", str(port), "--domain", "sb.bench"]
        args += [
            "--store",
            f"sqlite:///{tmp}/corral.db",
            "--state-dir",
            f"{tmp}/state",
            "--heartbeat-interval",
            "0.5",
        ]
        env = {**os.environ, "CORRAL_TOKEN": TOKEN}
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_ready(url, proc)
            api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            deadline = time.monotonic() + 30
            while True:
                r = api.post(
                    "/v1/sandboxes",
                    json={"memory_mb": 256, "network": {"mode": "internet", "deny_out": ["0.0.0.0/0"]}},
                )
                if r.status_code == 201 or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            r.raise_for_status()
            sid = r.json()["id"]
            ran = api.post(f"/v1/sandboxes/{sid}/exec", json={"command": start_argv(PORT)}).json()
            assert ran["stdout"].strip() == "listening", ran
            address = (
                api.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["python3", "-c", _ADDRESS]})
                .json()["stdout"]
                .strip()
            )
            host = f"{PORT}-{sid}.sb.bench"
            direct: list[float] = []
            proxied: list[float] = []
            with (
                httpx.Client(base_url=f"http://{address}:{PORT}", transport=_nodelay()) as d,
                httpx.Client(base_url=url, headers={"Host": host}, transport=_nodelay()) as p,
            ):
                for client in (d, p):  # warm both connections
                    client.get("/hello").raise_for_status()
                for _ in range(requests):
                    for client, samples in ((d, direct), (p, proxied)):
                        t = time.perf_counter()
                        client.get("/hello")
                        samples.append(time.perf_counter() - t)
            d_sum, p_sum = summary(direct), summary(proxied)
            out: list[dict[str, Any]] = [
                {"bench": "network.port", "path": "direct", **d_sum, "rps": round(len(direct) / sum(direct))},
                {
                    "bench": "network.port",
                    "path": "replica",
                    **p_sum,
                    "rps": round(len(proxied) / sum(proxied)),
                },
                {
                    "bench": "network.port",
                    "path": "overhead",
                    "p50_ms": round(p_sum["p50_ms"] - d_sum["p50_ms"], 3),
                    "p99_ms": round(p_sum["p99_ms"] - d_sum["p99_ms"], 3),
                    "bar_p50_ms": 1.0,
                },
            ]
            applied = []
            for i in range(updates):
                policy = {
                    "mode": "internet",
                    "deny_out": ["0.0.0.0/0"],
                    "allow_out": [f"198.51.100.{i % 200}/32"],
                }
                t = time.perf_counter()
                api.put(f"/v1/sandboxes/{sid}/network", json=policy).raise_for_status()
                applied.append(time.perf_counter() - t)
            out.append({"bench": "network.policy_update", **summary(applied), "bar_ms": 50})
            return out
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def _loopback_rtts(n: int = 3000) -> list[float]:
    server = socket.create_server(("127.0.0.1", 0))

    def echo() -> None:
        peer, _ = server.accept()
        peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := peer.recv(64):
            peer.sendall(data)
        peer.close()

    threading.Thread(target=echo, daemon=True).start()
    client = socket.create_connection(server.getsockname())
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    out = []
    for _ in range(n):
        t = time.perf_counter()
        client.sendall(b"x")
        client.recv(64)
        out.append(time.perf_counter() - t)
    client.close()
    server.close()
    return out


def tables(count: int) -> list[dict[str, Any]]:
    # Tables only (no namespace, no link), of a range of the bench's own.
    own = ipaddress.IPv4Network("10.233.64.0/20")
    made = [slot_net(i, own) for i in range(min(count, slot_count(own)))]
    bare = summary(_loopback_rtts())
    try:
        for slot in made:
            netns.load(render_table(slot, INTERNET))
        loaded = summary(_loopback_rtts())
    finally:
        for slot in made:
            netns.load(delete_table(slot))
    return [
        {"bench": "network.host_loopback_rtt", "slot_tables": 0, **bare},
        {"bench": "network.host_loopback_rtt", "slot_tables": len(made), **loaded},
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=40)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--tables", type=int, default=256)
    args = parser.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"bench": "network", "skipped": "needs root for network slots"}))
        return
    for line in asyncio.run(slots(args.slots)):
        print(json.dumps(line), flush=True)
    for line in ports(args.requests, args.updates):
        print(json.dumps(line), flush=True)
    for line in tables(args.tables):
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
