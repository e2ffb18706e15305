"""Create throughput and latency through HTTP, side by side with the ceiling: a bare FastAPI endpoint
on the same uvicorn settings, loaded by the same load generator in the same run. JSON lines.

    .venv/bin/python bench/api.py [--duration 8] [--concurrency 50 200] [--fleet 0 20000 100000]

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
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

TOKEN = "bench-admin-token-0123456789"
LUA = f"""
wrk.method = "POST"
wrk.body = '{{"memory_mb": 256}}'
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {TOKEN}"
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
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


def wrk(url: str, connections: int, duration: float, script: Path) -> dict[str, float]:
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
    return {
        "per_s": rps,
        "p50_ms": ms(lat.get("50", "nan")),
        "p99_ms": ms(lat.get("99", "nan")),
        "non_2xx": int(non2xx.group(1)) if non2xx else 0,
        "requests": int(total.group(1)) if total else 0,
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


def measure(
    tmp: Path, here: Path, env: dict[str, str], script: Path, fleet: int, c: int, duration: float
) -> dict[str, object]:
    # A fresh server per level, so one level's sandboxes do not slow the next.
    port, bare_port = free_port(), free_port()
    db = tmp / f"bench-{fleet}-{c}.db"
    corral = subprocess.Popen(
        [
            sys.executable,
            str(here / "filled_serve.py"),
            str(fleet),
            "--port",
            str(port),
            "--hosts",
            "12",
            "--store",
            f"sqlite:///{db}",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    bare = subprocess.Popen(
        [sys.executable, str(here / "bare_app.py"), str(bare_port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_ready(f"http://127.0.0.1:{port}", corral, timeout=120 + fleet / 1000)
        wait_ready(f"http://127.0.0.1:{bare_port}", bare)
        time.sleep(1.0)
        ceiling = loaded(f"http://127.0.0.1:{bare_port}/v1/sandboxes", bare.pid, c, duration, script)
        got = loaded(f"http://127.0.0.1:{port}/v1/sandboxes", corral.pid, c, duration, script)
    finally:
        for p in (corral, bare):
            p.terminate()
            p.wait(60)
        for f in tmp.glob(f"{db.name}*"):
            f.unlink()
    return {
        "bench": "api",
        "target": "corral serve --runtime sim --hosts 12",
        "live_sandboxes": fleet,
        "concurrency": c,
        "per_s": round(got["per_s"], 1),
        "ceiling_per_s": round(ceiling["per_s"], 1),
        "ratio": round(got["per_s"] / ceiling["per_s"], 3) if ceiling["per_s"] else None,
        "p50_ms": got["p50_ms"],
        "p99_ms": got["p99_ms"],
        "ceiling_p50_ms": ceiling["p50_ms"],
        "ceiling_p99_ms": ceiling["p99_ms"],
        "cpu_ms_per_req": _round(got.get("cpu_ms")),
        "ceiling_cpu_ms_per_req": _round(ceiling.get("cpu_ms")),
        # The ceiling's CPU per request over corral's (its background work and in-process agents
        # included): what the throughput ratio would be on an otherwise idle core.
        "cpu_ratio": _round(ceiling["cpu_ms"] / got["cpu_ms"])
        if "cpu_ms" in got and "cpu_ms" in ceiling
        else None,
        "non_2xx": got["non_2xx"],
        "requests": got["requests"],
    }


def _round(v: float | None) -> float | None:
    return round(v, 3) if v is not None else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--fleet", type=int, nargs="+", default=[0, 20_000, 100_000])
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        sys.exit("bench/api.py needs wrk: apt-get install wrk")
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    script = tmp / "create.lua"
    script.write_text(LUA)
    env = {**os.environ, "CORRAL_TOKEN": TOKEN}
    here = Path(__file__).resolve().parent
    for fleet in args.fleet:
        for c in args.concurrency:
            print(json.dumps(measure(tmp, here, env, script, fleet, c, args.duration)), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
