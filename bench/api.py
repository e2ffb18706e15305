"""Create throughput and latency through HTTP and HTTPS, side by side with the ceiling: a bare FastAPI
endpoint on the same uvicorn settings and transport, loaded by the same load generator in the same
run. JSON lines, one per fleet size, concurrency and transport.

    .venv/bin/python bench/api.py [--duration 8] [--concurrency 50 200] [--fleet 0 20000 100000]
        [--transports http https http-new https-new]

Transports: ``http`` and ``https`` keep their connections alive, as the SDK does (each wrk run opens
its ``--concurrency`` connections afresh, so an https line includes that many full handshakes; a
longer ``--duration`` amortizes them, as a client's pool does); ``http-new`` and ``https-new`` open a
new connection per create (``Connection: close``). wrk keeps its TLS session across reconnects, so an
https-new create pays a resumed TLS 1.3 handshake (as a client with a session cache does), and wrk
spends milliseconds of CPU of its own on each TLS connect (``client_cpu_ms_per_req``), taken from the
cores the server runs on: there the server's CPU per create is the figure to read, not creates/s.
An https line carries what TLS costs beside the http line of the same connection kind: in creates/s,
in the server's CPU per create, and in the client's. The https servers use ``--tls-dir``'s
certificate (self-signed, ECDSA P-256). ``--rounds`` interleaves the transports and reports each
one's medians.

Load comes from wrk (Debian package ``wrk``; a C load generator, so not the bottleneck). corral runs as
``corral serve --runtime sim --hosts 12`` (through bench/filled_serve.py) with hosts large enough that
capacity never refuses, and with ``--fleet`` live sandboxes already running and recorded before the
load starts: the create path's cost as the fleet fills, each level beside the bare endpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from corral.tls import CERT, self_signed

TOKEN = "bench-admin-token-0123456789"
LUA = f"""
wrk.method = "POST"
wrk.body = '{{"memory_mb": 256}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {TOKEN}"
"""
# The server closes after answering, and wrk reconnects: one TCP (and TLS) handshake per create.
NEW_CONNECTION = 'wrk.headers["Connection"] = "close"\n'
# Each transport: (over TLS, a new connection per create).
TRANSPORTS = {
    "http": (False, False),
    "https": (True, False),
    "http-new": (False, True),
    "https-new": (True, True),
}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60, ca: Path | None = None) -> None:
    """``ca``: the certificate an https server's is checked against."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=1, verify=str(ca) if ca else True).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(url)


def ms(value: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", value)
    if not m:
        return float("nan")
    n, unit = float(m.group(1)), m.group(2)
    return n / 1000 if unit == "us" else n * 1000 if unit == "s" else n


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children waited for so far: wrk's, here."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def wrk(url: str, connections: int, duration: float, script: Path) -> dict[str, float]:
    """wrk's figures, and its own CPU per request: it shares the machine's cores with the server, so
    what TLS costs the client comes out of the server's throughput too."""
    before = children_cpu_s()
    out = subprocess.run(
        [
            "wrk",
            "-t",
            "2",
            "-c",
            str(connections),
            "-d",
            f"{max(1, round(duration))}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    lat = dict(re.findall(r"^\s+(50|99)(?:\.000)?%\s+(\S+)", out, re.M))
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    total = re.search(r"(\d+) requests in", out)
    requests = int(total.group(1)) if total else 0
    return {
        "per_s": rps,
        "p50_ms": ms(lat.get("50", "nan")),
        "p99_ms": ms(lat.get("99", "nan")),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "requests": requests,
        "client_cpu_ms": (children_cpu_s() - before) * 1000 / max(1, requests),
    }


def cpu_s(pid: int) -> float | None:
    """CPU seconds (user + system) the process has used so far; None where /proc is not there."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loaded(url: str, pid: int, c: int, duration: float, script: Path) -> dict[str, float]:
    """wrk's numbers, and the server's CPU milliseconds per request over the same run: on a shared
    machine, throughput moves with the neighbours' load; the CPU a request costs moves much less."""
    before = cpu_s(pid)
    got = wrk(url, c, duration, script)
    after = cpu_s(pid)
    if before is not None and after is not None and got["requests"]:
        got["cpu_ms"] = (after - before) * 1000 / got["requests"]
    return got


class Servers:
    """A corral server and its bare ceiling on one transport, started together and ready."""

    def __init__(self, tmp: Path, here: Path, env: dict[str, str], fleet: int, tls_dir: Path | None) -> None:
        self.scheme = "https" if tls_dir else "http"
        tls = ["--tls-dir", str(tls_dir)] if tls_dir else []
        port, bare_port = free_port(), free_port()
        self.db = tmp / f"bench-{fleet}-{self.scheme}-{port}.db"
        self.tmp = tmp
        self.url = f"{self.scheme}://127.0.0.1:{port}"
        self.bare_url = f"{self.scheme}://127.0.0.1:{bare_port}"
        self.corral = subprocess.Popen(
            [
                sys.executable,
                str(here / "filled_serve.py"),
                str(fleet),
                "--port",
                str(port),
                "--hosts",
                "12",
                "--store",
                f"sqlite:///{self.db}",
                *tls,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.bare = subprocess.Popen(
            [sys.executable, str(here / "bare_app.py"), str(bare_port), *tls],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def wait(self, fleet: int, ca: Path) -> None:
        wait_ready(self.url, self.corral, 120 + fleet / 1000, ca)
        wait_ready(self.bare_url, self.bare, ca=ca)

    def stop(self) -> None:
        for p in (self.corral, self.bare):
            p.terminate()
            p.wait(60)
        for f in self.tmp.glob(f"{self.db.name}*"):
            f.unlink()


def measure(
    tmp: Path,
    here: Path,
    env: dict[str, str],
    fleet: int,
    c: int,
    duration: float,
    transports: list[str],
    rounds: int,
) -> list[dict[str, object]]:
    # Fresh servers per level, so one level's sandboxes do not slow the next; one pair per scheme,
    # so http and https each start from the same fleet and grow alike, round after round.
    tls_dir, ca = tmp / "tls", tmp / "tls" / CERT
    servers: dict[bool, Servers] = {}
    runs: dict[str, list[tuple[dict[str, float], dict[str, float]]]] = {t: [] for t in transports}
    try:
        for tls in sorted({TRANSPORTS[t][0] for t in transports}):
            servers[tls] = Servers(tmp, here, env, fleet, tls_dir if tls else None)
        for pair in servers.values():
            pair.wait(fleet, ca)
        time.sleep(1.0)
        # Transports interleaved, round after round: a neighbour's burst on a shared machine lands on
        # all of them, and each line is the median of its rounds.
        for _ in range(rounds):
            for transport in transports:
                tls, new = TRANSPORTS[transport]
                pair, script = servers[tls], tmp / ("create-new.lua" if new else "create.lua")
                ceiling = loaded(f"{pair.bare_url}/v1/sandboxes", pair.bare.pid, c, duration, script)
                got = loaded(f"{pair.url}/v1/sandboxes", pair.corral.pid, c, duration, script)
                runs[transport].append((got, ceiling))
    finally:
        for pair in servers.values():
            pair.stop()
    rows: list[dict[str, object]] = []
    # The http figures of each connection kind, for its https line's TLS cost.
    plain: dict[bool, dict[str, float]] = {}
    for transport in transports:
        tls, new = TRANSPORTS[transport]
        got, ceiling = median([g for g, _ in runs[transport]]), median([c for _, c in runs[transport]])
        row = line(fleet, c, transport, rounds, got, ceiling)
        if not tls:
            plain[new] = got
        elif new in plain:
            row |= tls_cost(got, plain[new])
        rows.append(row)
    return rows


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    """Each figure's median over the rounds; requests and refusals summed."""
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0] if all(k in r for r in runs)}
    for k in ("requests", "non_2xx"):
        out[k] = sum(r[k] for r in runs)
    return out


def line(
    fleet: int, c: int, transport: str, rounds: int, got: dict[str, float], ceiling: dict[str, float]
) -> dict[str, object]:
    return {
        "bench": "api",
        "target": "corral serve --runtime sim --hosts 12",
        "transport": transport,
        "live_sandboxes": fleet,
        "concurrency": c,
        "rounds": rounds,
        "per_s": round(got["per_s"], 1),
        "ceiling_per_s": round(ceiling["per_s"], 1),
        "ratio": round(got["per_s"] / ceiling["per_s"], 3) if ceiling["per_s"] else None,
        "p50_ms": got["p50_ms"],
        "p99_ms": got["p99_ms"],
        "ceiling_p50_ms": ceiling["p50_ms"],
        "ceiling_p99_ms": ceiling["p99_ms"],
        "cpu_ms_per_req": _round(got.get("cpu_ms")),
        "ceiling_cpu_ms_per_req": _round(ceiling.get("cpu_ms")),
        "client_cpu_ms_per_req": _round(got.get("client_cpu_ms")),
        # The ceiling's CPU per request over corral's (its background work and in-process agents
        # included): what the throughput ratio would be on an otherwise idle core.
        "cpu_ratio": _round(ceiling["cpu_ms"] / got["cpu_ms"])
        if "cpu_ms" in got and "cpu_ms" in ceiling
        else None,
        "non_2xx": int(got["non_2xx"]),
        "requests": int(got["requests"]),
    }


def tls_cost(tls: dict[str, float], plain: dict[str, float]) -> dict[str, object]:
    """What TLS costs a create beside plain HTTP on the same kind of connection: the creates/s it
    loses (the bar: <= 0.15), the server CPU per create it adds, which neighbours on a shared machine
    move less, and the client's (wrk's TLS work, taken from the same cores here)."""
    cost: dict[str, object] = {
        "tls_cost_per_s": round(1 - tls["per_s"] / plain["per_s"], 3) if plain["per_s"] else None
    }
    if "cpu_ms" in tls and "cpu_ms" in plain:
        cost["tls_cost_cpu"] = round(tls["cpu_ms"] / plain["cpu_ms"] - 1, 3)
        cost["tls_cpu_ms_per_req"] = round(tls["cpu_ms"] - plain["cpu_ms"], 3)
    cost["tls_client_cpu_ms_per_req"] = round(tls["client_cpu_ms"] - plain["client_cpu_ms"], 3)
    return cost


def _round(v: float | None) -> float | None:
    return round(v, 3) if v is not None else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--fleet", type=int, nargs="+", default=[0, 20_000, 100_000])
    parser.add_argument("--transports", nargs="+", choices=list(TRANSPORTS), default=list(TRANSPORTS))
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per level (medians)")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench/api.py needs wrk: apt-get install wrk")
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    (tmp / "create.lua").write_text(LUA)
    (tmp / "create-new.lua").write_text(LUA + NEW_CONNECTION)
    # Made once here: the https servers of a level start together and would race to make it.
    self_signed(tmp / "tls")
    env = {**os.environ, "CORRAL_TOKEN": TOKEN}
    here = Path(__file__).resolve().parent
    for fleet in args.fleet:
        for c in args.concurrency:
            for row in measure(tmp, here, env, fleet, c, args.duration, args.transports, args.rounds):
                print(json.dumps(row), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
