"""Sandbox networks, measured side by side in one run (root, iproute2 and nftables; JSON lines):

* ``slot``: a slot taken from the agent's pool (built ahead) beside one built on demand (the pool
  drained), p50/p99 of ``SlotPool.take`` (bar: pooled p50 <= 1 ms); and beside them the same
  policy transaction a take makes, through the ``nft -f`` command (how takes loaded it before
  libnftables: the command's start was the 18 ms a pooled take cost);
* ``port``: ``corral serve`` with one process host; a server in a sandbox (corral.testing.portserver);
  the same ``GET /hello`` over one kept-alive connection direct to the sandbox's slot address,
  through the replica by Host (spliced as bytes after its head), and through the replica's ASGI
  path (a connection the API's own request went first on stays the parser's), interleaved, p50/p99
  and each proxied overhead (bar: spliced p50 <= 1 ms).
  Both clients and the server send without Nagle's delay (TCP_NODELAY), as the replica's own
  sockets do (asyncio's): a server that writes its headers and its body apart otherwise waits for
  the headers' ACK, which the reader's delayed ACK holds up to 40 ms, and one path or the other
  measured that stall rather than the proxy;
* ``forwarded``: two ``corral api`` replicas on PostgreSQL (a schema of the run's own) and one
  ``corral agent``, the layout of a fleet whose replicas hold no agent: the same ``GET /hello``
  direct to the slot address and through a replica, which forwards it to the sandbox's agent (the
  hop, ``Corral-Forwarded``), interleaved, p50/p99, req/s and the hop's overhead; beside the
  ``port`` lines, whose replica holds its agent in-process (the owner);
* ``websockets``: in that fleet, ``--websockets`` connections held open at once through one replica
  (its connection and per-token bounds raised for the run; every connection carries the tenant's
  token; more than 1,024 meet the replica's per-sandbox port bound, which has no flag) to the echo server in the sandbox (its pids raised by a template, a thread per
  connection): the replica's and the agent's RSS before and with them open, per connection, and
  that every one echoed;
* ``policy``: ``PUT /v1/sandboxes/{id}/network`` on the running sandbox, end to end (the replica,
  the agent's nft transaction, the record), p50/p99 (bar: <= 50 ms);
* ``tables``: what slots cost the rest of the host: a TCP round trip on its loopback (as the
  control plane's, PostgreSQL's) with none of the bench's slots loaded, beside the same with
  ``--tables`` of them (their chains in the machine's one table, whose hooks every packet of the
  host passes once whatever the count; a table per slot, as before, passed it through each).

    .venv/bin/python bench/network.py [--requests 2000] [--slots 40] [--updates 40]
        [--websockets 1000] [--no-forwarded] [--no-websockets]

The fleet needs PostgreSQL (``CORRAL_TEST_POSTGRES_URL``, default the local ``test`` database);
without it its lines say ``skipped``.
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
import psycopg
from websockets.asyncio.client import connect as ws_connect

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parent.parent))  # tests.e2e.procs: the fleet's processes

from api import free_port, wait_ready

from corral.agent import netns
from corral.agent.netslots import SlotPool
from corral.core.netpolicy import INTERNET, remove_slot, render_policy, render_table, slot_count, slot_net
from corral.testing.portserver import start_argv
from tests.e2e.procs import Proc, process_fleet
from tests.pg import drop_schema, new_schema_name, pg_base_url, with_schema

TOKEN = "bench-network-token-0123456789"
PORT = 8080
_NO_EGRESS = {"mode": "internet", "deny_out": ["0.0.0.0/0"]}
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


def create_sandbox(api: httpx.Client, body: dict[str, Any]) -> str:
    """A running sandbox, created once its host has heartbeated in."""
    deadline = time.monotonic() + 30
    while True:
        r = api.post("/v1/sandboxes", json=body)
        if r.status_code == 201 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    r.raise_for_status()
    return str(r.json()["id"])


def serve_port(api: httpx.Client, sid: str) -> str:
    """Start the port server in sandbox ``sid``; its slot address."""
    ran = api.post(f"/v1/sandboxes/{sid}/exec", json={"command": start_argv(PORT)}).json()
    assert ran["stdout"].strip() == "listening", ran
    got = api.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["python3", "-c", _ADDRESS]}).json()
    return str(got["stdout"].strip())


def interleaved(
    address: str, replica: str, host: str, requests: int
) -> tuple[list[float], list[float], list[float]]:
    """``GET /hello`` direct to ``address``, through ``replica`` by ``host`` spliced (the replica's
    byte relay), and the same through its ASGI path (a connection whose first request was the API's
    own stays the parser's: the relay before the splice), in turn, each over its one kept-alive
    connection: (direct, spliced, asgi) seconds."""
    direct: list[float] = []
    proxied: list[float] = []
    parsed: list[float] = []
    with (
        httpx.Client(base_url=f"http://{address}:{PORT}", transport=_nodelay()) as d,
        httpx.Client(base_url=replica, headers={"Host": host}, transport=_nodelay()) as p,
        httpx.Client(base_url=replica, transport=_nodelay()) as a,
    ):
        a.get("/readyz").raise_for_status()  # the API's own first: the connection is the parser's
        for client in (d, p):  # warm both connections
            client.get("/hello").raise_for_status()
        a.get("/hello", headers={"Host": host}).raise_for_status()
        for _ in range(requests):
            for client, samples in ((d, direct), (p, proxied), (a, parsed)):
                t = time.perf_counter()
                client.get("/hello", headers={"Host": host})
                samples.append(time.perf_counter() - t)
    return direct, proxied, parsed


def line(path: str, samples: list[float]) -> dict[str, Any]:
    return {
        "bench": "network.port",
        "path": path,
        **summary(samples),
        "rps": round(len(samples) / sum(samples)),
    }


def overhead(path: str, direct: list[float], proxied: list[float], **bar: float) -> dict[str, Any]:
    d, p = summary(direct), summary(proxied)
    return {
        "bench": "network.port",
        "path": path,
        "p50_ms": round(p["p50_ms"] - d["p50_ms"], 3),
        "p99_ms": round(p["p99_ms"] - d["p99_ms"], 3),
        **bar,
    }


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
            sid = create_sandbox(api, {"memory_mb": 256, "network": _NO_EGRESS})
            address = serve_port(api, sid)
            direct, proxied, parsed = interleaved(address, url, f"{PORT}-{sid}.sb.bench", requests)
            out = [
                line("direct", direct),
                line("replica", proxied),
                line("replica_asgi", parsed),
                overhead("overhead", direct, proxied, bar_p50_ms=1.0),
                overhead("overhead_asgi", direct, parsed),
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


def rss_kib(pid: int) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmRSS:"):
            return int(row.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


async def _hold_websockets(url: str, n: int, key: str, open_at_once: int = 64) -> tuple[list[Any], int]:
    """``n`` WebSocket connections to ``url``, all open at once (opened ``open_at_once`` at a time, as
    clients arriving rather than one burst at the accept queue): the connections, and how many
    echoed a message of their own."""
    gate = asyncio.Semaphore(open_at_once)
    headers = {"Authorization": f"Bearer {key}"}

    async def one(i: int) -> tuple[Any, bool]:
        async with gate:
            ws = await ws_connect(url, additional_headers=headers, open_timeout=120, max_size=2**16)
        message = f"echo {i}"
        await ws.send(message)
        return ws, await asyncio.wait_for(ws.recv(), 60) == message

    got = await asyncio.gather(*(one(i) for i in range(n)))
    return [ws for ws, _ in got], sum(ok for _, ok in got)


def websockets_held(replica_pid: int, agent_pid: int, url: str, n: int, key: str) -> dict[str, Any]:
    async def run() -> dict[str, Any]:
        before = rss_kib(replica_pid), rss_kib(agent_pid)
        t = time.perf_counter()
        held, echoed = await _hold_websockets(url, n, key)
        opened_s = time.perf_counter() - t
        await asyncio.sleep(1)  # settled: buffers the opening burst grew are what they stay at
        during = rss_kib(replica_pid), rss_kib(agent_pid)

        # Every one still echoes with all of them open.
        async def again(i: int, ws: Any) -> bool:
            await ws.send(f"again {i}")
            return bool(await asyncio.wait_for(ws.recv(), 60) == f"again {i}")

        again_ok = sum(await asyncio.gather(*(again(i, ws) for i, ws in enumerate(held))))
        await asyncio.gather(*(ws.close() for ws in held))
        return {
            "bench": "network.websockets",
            "connections": n,
            "echoed": echoed,
            "echoed_all_open": again_ok,
            "open_all_s": round(opened_s, 2),
            "replica_rss_kib": [before[0], during[0]],
            "agent_rss_kib": [before[1], during[1]],
            "replica_kib_per_conn": round((during[0] - before[0]) / n, 1),
            "agent_kib_per_conn": round((during[1] - before[1]) / n, 1),
        }

    return asyncio.run(run())


def fleet(requests: int, websockets: int) -> list[dict[str, Any]]:
    """Direct beside forwarded through a replica that holds no agent; WebSockets held through one."""
    base = pg_base_url()
    try:
        drop_schema(base, "corral_netbench_probe")
    except psycopg.Error as exc:
        return [{"bench": "network.forwarded", "skipped": f"PostgreSQL at {base}: {exc}"}]
    schema = new_schema_name("corral_netbench")
    # Bounds raised for this run only: connections open at once on the replica (the one that binds:
    # under 300 the run's connections are closed on accept), and requests in flight for the one
    # tenant token every connection carries (port traffic does not count toward it: 400 held under
    # its default 256). The replica's per-sandbox port bound (1,024, a setting without a flag) stays.
    bound = str(max(4096, 2 * websockets))
    extra = ["--domain", "sb.bench", "--max-connections", bound, "--max-requests-per-token", bound]
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            process_fleet(Path(tmp), with_schema(base, schema), TOKEN, api_extra=extra) as (replicas, agent),
        ):
            admin = {"Authorization": f"Bearer {TOKEN}"}
            r = httpx.post(f"{replicas[0].url}/v1/tenants", json={"name": "bench"}, headers=admin, timeout=30)
            r.raise_for_status()
            key = r.json()["token"]
            # A thread per connection in the echo server: pids for them, from a template.
            r = httpx.post(
                f"{replicas[0].url}/v1/templates",
                json={"name": "wsbench", "memory_mb": 1024, "pids": 4 * max(websockets, 256)},
                headers=admin,
                timeout=30,
            )
            r.raise_for_status()
            replica = replicas[1]
            api = httpx.Client(base_url=replica.url, headers={"Authorization": f"Bearer {key}"}, timeout=60)
            sid = create_sandbox(api, {"template": "wsbench", "network": _NO_EGRESS})
            try:
                return _through_fleet(
                    replica, agent.popen.pid, sid, serve_port(api, sid), key, requests, websockets
                )
            finally:
                # A stopped agent leaves its sandboxes running (an agent's restart re-adopts them).
                api.delete(f"/v1/sandboxes/{sid}")
                api.close()
    finally:
        drop_schema(base, schema)


def _through_fleet(
    replica: Proc, agent_pid: int, sid: str, address: str, key: str, requests: int, websockets: int
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if requests:
        direct, forwarded, parsed = interleaved(address, replica.url, f"{PORT}-{sid}.sb.bench", requests)
        out += [
            line("fleet_direct", direct),
            line("forwarded", forwarded),
            line("forwarded_asgi", parsed),
            overhead("forwarded_overhead", direct, forwarded),
            overhead("forwarded_overhead_asgi", direct, parsed),
        ]
    if websockets:
        ws_url = replica.url.replace("http://", "ws://") + f"/v1/sandboxes/{sid}/ports/{PORT}/ws"
        out.append(websockets_held(replica.popen.pid, agent_pid, ws_url, websockets, key))
    return out


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
    # Chains and sets only (no namespace, no link), of a range of the bench's own.
    own = ipaddress.IPv4Network("10.233.64.0/20")
    made = [slot_net(i, own) for i in range(min(count, slot_count(own)))]
    bare = summary(_loopback_rtts())
    try:
        for slot in made:
            netns.load(render_table(slot, INTERNET))
        loaded = summary(_loopback_rtts())
    finally:
        for slot in made:
            netns.load(remove_slot(slot))
    return [
        {"bench": "network.host_loopback_rtt", "slots": 0, **bare},
        {"bench": "network.host_loopback_rtt", "slots": len(made), **loaded},
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--slots", type=int, default=40)
    parser.add_argument("--updates", type=int, default=40)
    parser.add_argument("--tables", type=int, default=256)
    parser.add_argument("--websockets", type=int, default=1000)
    parser.add_argument("--no-forwarded", action="store_true", help="skip the forwarded requests")
    parser.add_argument("--no-websockets", action="store_true", help="skip the WebSocket connections")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print(json.dumps({"bench": "network", "skipped": "needs root for network slots"}))
        return
    for row in asyncio.run(slots(args.slots)):
        print(json.dumps(row), flush=True)
    for row in ports(args.requests, args.updates):
        print(json.dumps(row), flush=True)
    requests = 0 if args.no_forwarded else args.requests
    websockets = 0 if args.no_websockets else args.websockets
    if requests or websockets:
        for row in fleet(requests, websockets):
            print(json.dumps(row), flush=True)
    for row in tables(args.tables):
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
