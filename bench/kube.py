"""The Kubernetes surface, each number beside its in-run comparison. JSON lines.

    .venv/bin/python bench/kube.py [--claims 100] [--kubectl 10] [--records 10000 100000] [--watches 100]

- claim: a SandboxClaim POSTed to Ready on a kept-alive HTTPS connection (the server side) beside a
  REST warm create (``POST /v1/sandboxes``) on the same server, interleaved; then end to end, a real
  kubectl's ``apply -f`` and ``wait --for=condition=Ready`` beside its bare ``get --raw /version``
  (what a kubectl process costs before it asks anything);
- list: the 10,000 sandboxes of one namespace as one Table, and as ``kubectl get sandboxes`` reads
  them (Tables of 500, following ``continue``), beside the REST list of the same records (its pages
  of 1,000);
- get: one sandbox by name (the item and the ``--field-selector metadata.name=`` list) from a server
  of each of ``--records``, all serving at once and asked in turn (the 100,000 level is the slow
  part to fill: ``--records 10000`` leaves it out);
- watch: 100 watches open on one ``corral api`` replica, changes made through another on PostgreSQL:
  from the change's request (and from its answer) to each watch's event, p50/p99, for a warm pool
  changed through the API and for sandbox records written by a third process; and the watches'
  replica's CPU per change (what every watch's event costs it).

``corral serve --runtime sim`` (through bench/filled_serve.py) holds the records, written in bulk
before it serves. PostgreSQL comes from ``CORRAL_TEST_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``), in a schema of its own dropped afterwards.

Bars (issue 27): claim to Ready server side p50 <= 5 ms; Table list of 10,000 <= 200 ms; get by name
from 10,000 to 100,000 records, ratio <= 1.2; watch across replicas p99 <= 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
from api import cpu_s, free_port  # bench/ is the script's directory
from seed import record_running, sandbox_id

from corral.store import open_store
from corral.store.sql import SqlStore

TOKEN = "bench-admin-token-0123456789"
HERE = Path(__file__).resolve().parent
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432/test"
CORE = "/apis/agents.x-k8s.io/v1beta1"
EXT = "/apis/extensions.agents.x-k8s.io/v1beta1"
# What kubectl get asks for.
TABLE = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LIST_REPS = 5
FLEET = f"{CORE}/namespaces/fleet/sandboxes"


def emit(**row: Any) -> None:
    print(json.dumps(row), flush=True)


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(p * len(s)))], 3)


def stats(xs: list[float]) -> dict[str, float]:
    return {"p50_ms": pct(xs, 0.5), "p99_ms": pct(xs, 0.99), "n": len(xs)}


def timed(f: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = f(*args, **kwargs)
    return (time.perf_counter() - t0) * 1000, out


class ServerCpu:
    """The server's CPU milliseconds over a stretch of requests: on a shared machine wall time moves
    with the neighbours' load; the CPU a request costs moves much less."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.spent: dict[str, float] = {}

    @contextlib.contextmanager
    def on(self, what: str) -> Iterator[None]:
        before = cpu_s(self.pid)
        yield
        after = cpu_s(self.pid)
        if before is not None and after is not None:
            self.spent[what] = self.spent.get(what, 0.0) + (after - before) * 1000

    def per_request(self, what: str, n: int) -> float | None:
        return round(self.spent[what] / n, 3) if what in self.spent and n else None


def ready(url: str, proc: subprocess.Popen[bytes], verify: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/readyz", verify=verify, timeout=1).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(url)


@contextlib.contextmanager
def filled(tmp: Path, records: int, heartbeat_s: float = 2.0) -> Iterator[tuple[str, str, ServerCpu]]:
    """``corral serve`` over HTTPS with ``records`` running sandboxes of tenant ``fleet``: (url, CA,
    its CPU). ``heartbeat_s``: its hosts' interval (short fills a warm pool sooner, and costs the
    server more the more sandboxes its hosts list)."""
    port = free_port()
    tls = tmp / f"tls-{records}-{heartbeat_s}"
    db = tmp / f"kube-{records}-{heartbeat_s}.db"
    args = [sys.executable, str(HERE / "filled_serve.py"), str(records), "--port", str(port)]
    args += ["--store", f"sqlite:///{db}", "--tls-dir", str(tls), "--heartbeat-interval", str(heartbeat_s)]
    proc = subprocess.Popen(
        args,
        env={**os.environ, "CORRAL_TOKEN": TOKEN},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not (tls / "server.crt").exists():
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("corral serve did not start")
            time.sleep(0.2)
        ca = str(tls / "server.crt")
        ready(url, proc, ca, 120 + records / 500)
        yield url, ca, ServerCpu(proc.pid)
    finally:
        proc.terminate()
        proc.wait(60)
        for f in tmp.glob(f"{db.name}*"):
            f.unlink()


# -- claim ----------------------------------------------------------------------------------------


def claim_bench(url: str, ca: str, cpu: ServerCpu, tmp: Path, n: int, n_kubectl: int) -> None:
    with httpx.Client(base_url=url, verify=ca, headers=AUTH, timeout=60) as c:
        c.post(f"{EXT}/namespaces/default/sandboxtemplates", json=_obj("py", {"memoryMB": 256}))
        want = 2 * n + n_kubectl + 10
        c.post(
            f"{EXT}/namespaces/default/sandboxwarmpools",
            json=_obj("py", {"replicas": want, "sandboxTemplateRef": {"name": "py"}}),
        ).raise_for_status()
        deadline = time.monotonic() + 180
        while c.get(f"{EXT}/namespaces/default/sandboxwarmpools/py").json()["status"]["readyReplicas"] < want:
            if time.monotonic() > deadline:
                raise TimeoutError("the warm pool did not fill")
            time.sleep(0.5)
        kube, rest, kube_warm, rest_warm = [], [], 0, 0
        for i in range(n):
            # Interleaved, so the two see the same pool and the same neighbours.
            claim = _obj(f"c{i}", {"warmPoolRef": {"name": "py"}})
            with cpu.on("claim"):
                ms, r = timed(c.post, f"{EXT}/namespaces/default/sandboxclaims", json=claim)
            body = r.json()
            assert r.status_code == 201 and body["status"]["conditions"][0]["status"] == "True", r.text
            kube.append(ms)
            kube_warm += body["status"]["launchType"] == "warm"
            with cpu.on("rest"):
                ms, r = timed(c.post, "/v1/sandboxes", json={"template": "py"})
            assert r.status_code == 201, r.text
            rest.append(ms)
            rest_warm += bool(r.json()["warm"])
    emit(
        bench="kube",
        what="claim_to_ready_server_side",
        how="POST SandboxClaim, answered Ready, one HTTPS keep-alive connection",
        **stats(kube),
        server_cpu_ms=cpu.per_request("claim", n),
        warm=kube_warm,
        rest_warm_create={**stats(rest), "server_cpu_ms": cpu.per_request("rest", n)},
        rest_warm=rest_warm,
        bar_p50_ms=5.0,
        agent_sandbox_p50_ms="500-800",
    )
    kubectl_e2e(url, ca, tmp, n_kubectl)


def _obj(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": spec}


def kubectl_e2e(url: str, ca: str, tmp: Path, n: int) -> None:
    kubectl = shutil.which("kubectl", path=str(Path(sys.executable).parent)) or shutil.which("kubectl")
    if kubectl is None or n == 0:
        emit(bench="kube", what="claim_kubectl_end_to_end", skipped="no kubectl (the dev extra)")
        return
    config = tmp / "kubeconfig"
    config.write_text(
        subprocess.run(
            [
                sys.executable,
                "-m",
                "corral",
                "kubeconfig",
                "--server",
                url,
                "--tls-dir",
                str(Path(ca).parent),
            ],
            env={**os.environ, "CORRAL_TOKEN": TOKEN},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    env = {**os.environ, "KUBECONFIG": str(config), "HOME": str(tmp)}

    def run(*args: str, stdin: str | None = None) -> float:
        ms, done = timed(
            subprocess.run, [kubectl, *args], env=env, input=stdin, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        return float(ms)

    bare, apply, whole = [], [], []
    for i in range(n):
        bare.append(run("get", "--raw", "/version"))
        claim = (
            "apiVersion: extensions.agents.x-k8s.io/v1beta1\nkind: SandboxClaim\n"
            f"metadata: {{name: k{i}}}\nspec: {{warmPoolRef: {{name: py}}}}\n"
        )
        a = run("apply", "-f", "-", stdin=claim)
        w = run("wait", "--for=condition=Ready", f"sandboxclaim/k{i}", "--timeout=30s")
        apply.append(a)
        whole.append(a + w)
    emit(
        bench="kube",
        what="claim_kubectl_end_to_end",
        how="kubectl apply -f, then kubectl wait --for=condition=Ready (two processes)",
        apply_then_wait=stats(whole),
        apply=stats(apply),
        kubectl_get_raw_version=stats(bare),
    )


# -- list and get ---------------------------------------------------------------------------------


def table_bench(c: httpx.Client, cpu: ServerCpu, records: int) -> None:
    """The whole namespace as one Table (``kubectl get --chunk-size=0``), and as kubectl gets it by
    default: pages of 500, each asked with the last one's ``continue`` token, until the last."""
    whole, paged, rest = [], [], []
    rows = paged_rows = pages = listed = 0
    for _ in range(LIST_REPS):
        with cpu.on("table"):
            ms, r = timed(c.get, FLEET, headers={"Accept": TABLE})
        rows = len(r.json()["rows"])
        whole.append(ms)
        with cpu.on("table_paged"):
            ms, (paged_rows, pages) = timed(_table_pages, c)
        paged.append(ms)
        with cpu.on("rest_list"):
            ms, listed = timed(_rest_all, c)
        rest.append(ms)
    emit(
        bench="kube",
        what="table_list",
        records=records,
        rows=rows,
        **stats(whole),
        server_cpu_ms=cpu.per_request("table", LIST_REPS),
        kubectl_pages_of_500={
            **stats(paged),
            "server_cpu_ms": cpu.per_request("table_paged", LIST_REPS),
            "rows": paged_rows,
            "requests": pages,
        },
        rest_list_pages_of_1000={**stats(rest), "server_cpu_ms": cpu.per_request("rest_list", LIST_REPS)},
        rest_rows=listed,
        bar_ms=200,
    )


def _table_pages(c: httpx.Client) -> tuple[int, int]:
    n = pages = 0
    token = ""
    while True:
        params = {"limit": "500", **({"continue": token} if token else {})}
        got = c.get(FLEET, params=params, headers={"Accept": TABLE}).json()
        n, pages = n + len(got["rows"]), pages + 1
        token = got["metadata"].get("continue", "")
        if not token:
            return n, pages


def get_bench(clients: dict[int, httpx.Client], reps: int) -> None:
    """A named sandbox got from each server in turn, so that every size sees the same neighbours."""
    item: dict[int, list[float]] = {n: [] for n in clients}
    selected: dict[int, list[float]] = {n: [] for n in clients}
    for c in clients.values():
        made = c.post(FLEET, json=_obj("target", {"memoryMB": 256}))
        assert made.status_code == 201, made.text
    for _ in range(reps):
        for n, c in clients.items():
            ms, r = timed(c.get, f"{FLEET}/target")
            assert r.status_code == 200
            item[n].append(ms)
            ms, r = timed(
                c.get, FLEET, params={"fieldSelector": "metadata.name=target"}, headers={"Accept": TABLE}
            )
            assert len(r.json()["rows"]) == 1
            selected[n].append(ms)
    for n in clients:
        emit(
            bench="kube",
            what="get_by_name",
            records=n,
            item=stats(item[n]),
            field_selector=stats(selected[n]),
        )
    if len(clients) > 1:
        lo, hi = min(clients), max(clients)
        emit(
            bench="kube",
            what="get_by_name_ratio",
            records=[lo, hi],
            item_ratio=round(statistics.median(item[hi]) / statistics.median(item[lo]), 3),
            field_selector_ratio=round(statistics.median(selected[hi]) / statistics.median(selected[lo]), 3),
            bar_ratio=1.2,
        )


def _rest_all(c: httpx.Client) -> int:
    n, cursor = 0, None
    while True:
        params: dict[str, Any] = {"limit": 1000}
        if cursor:
            params["cursor"] = cursor
        page = c.get("/v1/sandboxes", params=params).json()
        n += len(page["sandboxes"])
        cursor = page["next_cursor"]
        if not cursor:
            return n


# -- watch ----------------------------------------------------------------------------------------


def pg_url(base: str, schema: str) -> str:
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


async def watch_bench(tmp: Path, watches: int, changes: int) -> None:
    import psycopg
    from psycopg import sql

    base = os.environ.get("CORRAL_TEST_POSTGRES_URL", DEFAULT_PG)
    schema = f"bench_kube_{os.getpid()}_{secrets.token_hex(3)}"
    url = pg_url(base, schema)
    procs = []
    try:
        ports = [free_port(), free_port()]
        for i, port in enumerate(ports):
            args = [sys.executable, "-m", "corral", "api", "--store", url, "--port", str(port)]
            args += ["--replica-id", f"bench-{i}", "--log-format", "json"]
            procs.append(
                subprocess.Popen(
                    args,
                    env={**os.environ, "CORRAL_TOKEN": TOKEN},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            ready(f"http://127.0.0.1:{port}", procs[-1], True, 60)
        a, b = (f"http://127.0.0.1:{p}" for p in ports)
        async with (
            httpx.AsyncClient(base_url=a, headers=AUTH, timeout=30) as on_a,
            httpx.AsyncClient(
                base_url=b,
                headers=AUTH,
                timeout=httpx.Timeout(30, read=None),
                limits=httpx.Limits(max_connections=watches + 10),
            ) as on_b,
        ):
            await on_a.post(f"{EXT}/namespaces/default/sandboxtemplates", json=_obj("w", {"memoryMB": 256}))
            r = await on_a.post(
                f"{EXT}/namespaces/default/sandboxwarmpools",
                json=_obj("w", {"replicas": 0, "sandboxTemplateRef": {"name": "w"}}),
            )
            r.raise_for_status()

            async def patch_pool(k: int) -> None:
                r = await on_a.patch(
                    f"{EXT}/namespaces/default/sandboxwarmpools/w",
                    json={"spec": {"replicas": k}},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                r.raise_for_status()

            b_cpu = ServerCpu(procs[1].pid)
            await measure_watch(
                on_b,
                f"{EXT}/namespaces/default/sandboxwarmpools",
                watches,
                changes,
                patch_pool,
                "pool",
                b_cpu,
            )

            store = open_store(url)
            assert isinstance(store, SqlStore)
            try:
                tenant = await store.get_tenant_by_name("default")
                assert tenant is not None
                sid = sandbox_id()
                await record_running(store, tenant.id, [(sid, "bench-host")], 256, time.time())

                async def touch(k: int) -> None:
                    await store.set_sandbox_expiry(sid, time.time() + 3600 + k)

                await measure_watch(
                    on_b, f"{CORE}/namespaces/default/sandboxes", watches, changes, touch, "sandbox", b_cpu
                )
            finally:
                await store.close()
    finally:
        for p in procs:
            p.terminate()
            p.wait(60)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


async def measure_watch(
    on_b: httpx.AsyncClient,
    path: str,
    watches: int,
    changes: int,
    change: Callable[[int], Any],
    what: str,
    cpu: ServerCpu,
) -> None:
    """``cpu``: the watches' replica's, per change (its share of every watch's event)."""
    listed = await on_b.get(path)
    rv = listed.json()["metadata"]["resourceVersion"]
    seen: list[list[float]] = [[] for _ in range(watches)]
    opened = asyncio.Event()
    open_count = 0

    async def follow(i: int) -> None:
        nonlocal open_count
        params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "600"}
        async with on_b.stream("GET", path, params=params) as r:
            open_count += 1
            if open_count == watches:
                opened.set()
            async for line in r.aiter_lines():
                # A watch resumed from a version sees an object's first change as ADDED.
                if line and json.loads(line)["type"] in ("ADDED", "MODIFIED"):
                    seen[i].append(time.perf_counter())

    tasks = [asyncio.create_task(follow(i)) for i in range(watches)]
    await asyncio.wait_for(opened.wait(), 60)
    await asyncio.sleep(0.5)
    from_request: list[float] = []
    from_answer: list[float] = []
    try:
        with cpu.on(what):
            await _changes(changes, change, seen, from_request, from_answer)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    emit(
        bench="kube",
        what="watch_across_replicas",
        changed=what,
        watches=watches,
        changes=changes,
        from_change_request=stats(from_request),
        from_change_answer=stats(from_answer),
        watch_replica_cpu_ms_per_change=cpu.per_request(what, changes),
        missed=watches * changes - len(from_request),
        bar_p99_ms=100,
    )


async def _changes(
    changes: int,
    change: Callable[[int], Any],
    seen: list[list[float]],
    from_request: list[float],
    from_answer: list[float],
) -> None:
    for k in range(1, changes + 1):
        t0 = time.perf_counter()
        await change(k)
        t1 = time.perf_counter()
        deadline = t1 + 10
        while any(len(s) < k for s in seen) and time.perf_counter() < deadline:
            await asyncio.sleep(0.001)
        for s in seen:
            if len(s) >= k:
                from_request.append((s[k - 1] - t0) * 1000)
                from_answer.append((s[k - 1] - t1) * 1000)
        await asyncio.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--claims", type=int, default=100)
    parser.add_argument("--kubectl", type=int, default=10)
    parser.add_argument("--records", type=int, nargs="+", default=[10_000])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--watches", type=int, default=100)
    parser.add_argument("--changes", type=int, default=30)
    parser.add_argument("--skip", nargs="*", default=[], choices=["claim", "list", "watch"])
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-kube-"))
    try:
        if "claim" not in args.skip:
            with filled(tmp, args.records[0], heartbeat_s=0.2) as (url, ca, cpu):
                claim_bench(url, ca, cpu, tmp, args.claims, args.kubectl)
        if "list" not in args.skip:
            # Every size served at once, its hosts beating slowly: the lookups are measured side by
            # side, not the background work of heartbeats listing 100,000 sandboxes.
            with contextlib.ExitStack() as stack:
                clients = {}
                for records in args.records:
                    url, ca, cpu = stack.enter_context(filled(tmp, records, heartbeat_s=10.0))
                    clients[records] = stack.enter_context(
                        httpx.Client(base_url=url, verify=ca, headers=AUTH, timeout=120)
                    )
                    if records <= 10_000:
                        table_bench(clients[records], cpu, records)
                get_bench(clients, args.reps)
        if "watch" not in args.skip:
            asyncio.run(watch_bench(tmp, args.watches, args.changes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
