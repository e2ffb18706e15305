"""``commands.run("true")`` through the unmodified e2b SDK beside corral's own exec, on one sandbox of
one ``corral serve --runtime process``, interleaved in rounds so the machine's load lands on both.
Prints one JSON line per round and path, then a summary line with the medians and their ratio.

    .venv/bin/python bench/e2b.py [--rounds 5] [--calls 40]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx

ADMIN = "bench-e2b-admin-token-012345678"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _p50(call: Callable[[], object], n: int) -> float:
    took = []
    for _ in range(n):
        began = time.perf_counter()
        call()
        took.append((time.perf_counter() - began) * 1000.0)
    return statistics.median(took)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=40)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-e2b-"))
    port = _port()
    url = f"http://127.0.0.1:{port}"
    corral = Path(sys.executable).with_name("corral")
    argv = [str(corral), "serve", "--runtime", "process", "--hosts", "1", "--port", str(port)]
    argv += ["--store", f"sqlite:///{work / 'corral.db'}", "--state-dir", str(work / "state")]
    server = subprocess.Popen(
        argv, env={**os.environ, "CORRAL_TOKEN": ADMIN}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("corral serve did not become ready")
            time.sleep(0.2)
        admin = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"})
        key = admin.post("/v1/tenants", json={"name": "bench"}).json()["token"]
        os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=key)
        # This script's own name would shadow the SDK's package: look it up without bench/ on the path.
        here = Path(__file__).resolve().parent
        sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
        sandbox_class = importlib.import_module("e2b").Sandbox

        sandbox = sandbox_class.create()
        own = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
        exec_path = f"/v1/sandboxes/{sandbox.sandbox_id}/exec"

        def corral_exec() -> None:
            r = own.post(exec_path, json={"command": ["true"]})
            assert r.status_code == 200 and r.json()["exit_code"] == 0

        def sdk_run() -> None:
            assert sandbox.commands.run("true").exit_code == 0

        sdk_run()
        corral_exec()  # warm both paths (connections, the launcher's build)
        rows: dict[str, list[float]] = {"sdk_commands_run": [], "corral_exec": []}
        for i in range(args.rounds):
            for name, call in (("sdk_commands_run", sdk_run), ("corral_exec", corral_exec)):
                p50 = _p50(call, args.calls)
                rows[name].append(p50)
                print(json.dumps({"round": i, "path": name, "calls": args.calls, "p50_ms": round(p50, 2)}))
        sdk, own_p50 = statistics.median(rows["sdk_commands_run"]), statistics.median(rows["corral_exec"])
        print(
            json.dumps(
                {
                    "summary": "e2b",
                    "sdk_commands_run_p50_ms": round(sdk, 2),
                    "corral_exec_p50_ms": round(own_p50, 2),
                    "ratio": round(sdk / own_p50, 2),
                }
            )
        )
        sandbox.kill()
    finally:
        server.terminate()
        server.wait(30)


if __name__ == "__main__":
    main()
