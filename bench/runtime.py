"""Runtime benchmark. The process runtime: create-to-first-exec latency (sequential and concurrent),
the exec round trip and a warm sandbox's first exec through the sandbox's init (the guest channel)
beside the host-side launcher, interleaved in the same run (and an image sandbox's exec round trip
and create -> first exec, through its command server beside the launcher's exec-root), a file's
stat, read and write through the agent's data plane by the launcher's fs mode beside the Python
helper (interleaved likewise), and the host memory each idle sandbox costs. Then the gvisor runtime in the same run (where runsc works):
cold create-to-first-exec, a warm sandbox's first exec, and the memory of everything runsc runs per
idle sandbox (its Sentry, gofer and the platform's stubs). Prints one JSON object per line.

    .venv/bin/python bench/runtime.py [--sequential 50] [--concurrency 8] [--rounds 5] [--idle 20]
                                      [--execs 200] [--warm 30] [--files 100] [--only-exec]
                                      [--only-files] [--no-gvisor]

Needs what the runtimes need (bubblewrap; runsc; root for the cgroups); bars: create-to-first-exec
p50 <= 50 ms; exec round trip through the channel p50 <= 3 ms and <= 1/2 of the launcher's; warm
first exec p50 <= 10 ms; gVisor: cold create-to-first-exec p50 reported, warm first exec p50
<= 15 ms, memory per idle sandbox reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.envd import Envd
from corral.agent.protocol import StartSandbox
from corral.images.digest import digest_file
from corral.runtime import gvisor, procfs
from corral.runtime.base import Runtime, SandboxSpec
from corral.runtime.cgroups import CgroupRoot, detect
from corral.runtime.process import ProcessRuntime, unavailable_reason
from corral.runtime.statedir import Running
from corral.testing.erofs import small_image
from corral.testing.resolver import DictResolver


def _percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def _summary(mode: str, samples_ms: list[float], **extra: object) -> dict[str, object]:
    return {
        "bench": "runtime",
        "mode": mode,
        "n": len(samples_ms),
        "p50_ms": round(statistics.median(samples_ms), 2),
        "p99_ms": round(_percentile(samples_ms, 0.99), 2),
        "max_ms": round(max(samples_ms), 2),
        **extra,
    }


async def _create_to_first_exec(runtime: Runtime, sandbox_id: str) -> float:
    started = time.perf_counter()
    await runtime.start(SandboxSpec(id=sandbox_id, memory_mb=256))
    result = await runtime.exec(sandbox_id, ["true"])
    elapsed = (time.perf_counter() - started) * 1000.0
    if result.exit_code != 0:
        raise RuntimeError(f"first exec failed: {result.stderr}")
    return elapsed


def _pss_mb(runtime: ProcessRuntime, sandbox_id: str) -> float:
    """User-space memory of every process of the sandbox (bubblewrap's monitor included), shared
    pages split among their users: what the host pays per sandbox, read directly rather than as a
    host-wide difference that neighbours' activity would swamp."""
    record = runtime.statedir.load(sandbox_id)
    if not isinstance(record, Running) or record.cgroup is None:
        return 0.0
    return _pss_of([int(pid) for pid in (Path(record.cgroup) / "cgroup.procs").read_text().split()])


def _pss_of(pids: list[int]) -> float:
    return sum(procfs.proportional_kib(pid) for pid in pids) / 1024


async def _timed_exec(runtime: Runtime, sandbox_id: str) -> float:
    started = time.perf_counter()
    result = await runtime.exec(sandbox_id, ["true"])
    elapsed = (time.perf_counter() - started) * 1000.0
    if result.exit_code != 0:
        raise RuntimeError(f"exec failed: {result.stderr}")
    return elapsed


async def _timed_runsc_exec(runtime: gvisor.GvisorRuntime, sandbox_id: str) -> float:
    """``true`` through a ``runsc exec`` of its own, as the sandbox's user: the per-command host process
    the control socket replaced, for comparison in the same run."""
    argv = runtime._argv("exec", "--user", "1000:1000", runtime._cid(sandbox_id), "true")
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(*argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    await proc.communicate()
    elapsed = (time.perf_counter() - started) * 1000.0
    if proc.returncode != 0:
        raise RuntimeError(f"runsc exec failed: {proc.returncode}")
    return elapsed


async def _stop_all(runtime: Runtime, cgroups: CgroupRoot | None) -> None:
    for handle in await runtime.list():
        await runtime.stop(handle.id)
    if cgroups is not None:
        cgroups.remove_if_empty()


def _side_by_side(mode: str, channel: list[float], launcher: list[float]) -> list[dict[str, object]]:
    ratio = round(statistics.median(channel) / statistics.median(launcher), 3)
    return [
        _summary(f"{mode}_channel", channel, path="guest channel"),
        _summary(f"{mode}_launcher", launcher, path="launcher"),
        {"bench": "runtime", "mode": f"{mode}_ratio", "channel_over_launcher_p50": ratio},
    ]


async def _alternated(
    mode: str, channel_rt: ProcessRuntime, launcher_rt: ProcessRuntime, sandbox_id: str, execs: int
) -> list[dict[str, object]]:
    """``execs`` round trips of ``true`` through each path, alternated sample by sample."""
    by_path: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * execs + 20):
        use_channel = i % 2 == 0
        elapsed = await _timed_exec(channel_rt if use_channel else launcher_rt, sandbox_id)
        if i >= 20:  # the first few of each warm the caches
            by_path[use_channel].append(elapsed)
    return _side_by_side(mode, by_path[True], by_path[False])


async def run_exec(root: Path, cgroups: CgroupRoot | None, execs: int, warm: int) -> list[dict[str, object]]:
    """The exec round trip (``true``) and a warm sandbox's first exec, through the guest channel and
    through the launcher, alternated sample by sample on the same sandboxes so that the machine's load
    lands on both: two runtime objects over one root, one of which never uses the channel."""
    channel_rt = ProcessRuntime(root, cgroup_root=cgroups)
    launcher_rt = ProcessRuntime(root, cgroup_root=cgroups, guest_channel=False)
    results: list[dict[str, object]] = []
    await channel_rt.start(SandboxSpec(id="exec", memory_mb=256))
    try:
        results += await _alternated("exec", channel_rt, launcher_rt, "exec", execs)
    finally:
        await channel_rt.stop("exec")
    # Warm: started ahead, as a warm pool's are; the first command is what a claim waits for.
    by_path: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * warm):
        sandbox_id = f"warm-{i}"
        await channel_rt.start(SandboxSpec(id=sandbox_id, memory_mb=256))
        try:
            use_channel = i % 2 == 0
            by_path[use_channel].append(
                await _timed_exec(channel_rt if use_channel else launcher_rt, sandbox_id)
            )
        finally:
            await channel_rt.stop(sandbox_id)
    results += _side_by_side("warm_first_exec", by_path[True], by_path[False])
    return results + await run_image_exec(root, cgroups, execs, warm)


_IMAGE_DISK_MB = 64


async def run_image_exec(
    root: Path, cgroups: CgroupRoot | None, execs: int, creates: int
) -> list[dict[str, object]]:
    """An image sandbox's exec round trip through its command server (the guest channel) beside the
    launcher's ``exec-root``, and its create -> first exec with the server beside without it,
    alternated as above: two runtime objects over one root, the second without the channel, each with
    a disk pool of its own (filled before each create, as bench/rootfs.py does)."""
    if os.geteuid() != 0:
        return [{"bench": "runtime", "mode": "image_exec", "skipped": "image sandboxes need root"}]
    image = small_image()
    digest = digest_file(image)
    resolver = DictResolver({digest: image})
    disks = root / ".disks"
    channel_rt = ProcessRuntime(root, cgroup_root=cgroups, images=resolver, disk_root=disks / "channel")
    launcher_rt = ProcessRuntime(
        root, cgroup_root=cgroups, images=resolver, disk_root=disks / "launcher", guest_channel=False
    )
    results: list[dict[str, object]] = []
    try:
        await channel_rt.start(
            SandboxSpec(id="image-exec", memory_mb=256, image=digest, disk_mb=_IMAGE_DISK_MB)
        )
        try:
            results += await _alternated("image_exec", channel_rt, launcher_rt, "image-exec", execs)
        finally:
            await channel_rt.stop("image-exec")
        by_path: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 * creates):
            use_channel = i % 2 == 0
            runtime = channel_rt if use_channel else launcher_rt
            await runtime.fill_disks(_IMAGE_DISK_MB)
            sandbox_id = f"image-first-{i}"
            started = time.perf_counter()
            await runtime.start(
                SandboxSpec(id=sandbox_id, memory_mb=256, image=digest, disk_mb=_IMAGE_DISK_MB)
            )
            try:
                await _timed_exec(runtime, sandbox_id)
                by_path[use_channel].append((time.perf_counter() - started) * 1000.0)
            finally:
                await runtime.stop(sandbox_id)
        results += _side_by_side("image_create_first_exec", by_path[True], by_path[False])
    finally:
        await channel_rt.drain_disks()
        await launcher_rt.drain_disks()
    return results


class _EitherFiles(ProcessRuntime):
    """The process runtime, offering its launcher to the data plane's file operations or not (then
    they run helper.py under the sandbox's python3), as ``native`` says at the moment of the call."""

    native = True

    async def guest_program(self, sandbox_id: str) -> str | None:
        return await super().guest_program(sandbox_id) if self.native else None


async def run_files(root: Path, cgroups: CgroupRoot | None, files: int) -> list[dict[str, object]]:
    """A 4 KiB file's stat, read and write through the agent's data plane (its Envd app, in process),
    by the launcher's fs mode and by the helper, alternated sample by sample on one sandbox."""
    runtime = _EitherFiles(root, cgroup_root=cgroups)
    agent = Agent(
        AgentConfig("bench", 4096, 2.0, address="http://127.0.0.1:1"), runtime, pressure=lambda: 0.0
    )
    await agent.start(StartSandbox(id="files", memory_mb=256))
    body = os.urandom(4096)
    calls: dict[str, Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]] = {
        "stat": lambda c: c.post("/filesystem.Filesystem/Stat", json={"path": "bench.bin"}),
        "read": lambda c: c.get("/files", params={"path": "bench.bin"}),
        "write": lambda c: c.post("/files", params={"path": "bench.bin"}, content=body),
    }
    results: list[dict[str, object]] = []
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(Envd(agent)),
            base_url="http://envd",
            headers={"E2b-Sandbox-Id": "files"},
        ) as client:
            await calls["write"](client)
            for op, call in calls.items():
                by_path: dict[bool, list[float]] = {True: [], False: []}
                for i in range(2 * files + 10):
                    runtime.native = i % 2 == 0
                    started = time.perf_counter()
                    r = await call(client)
                    elapsed = (time.perf_counter() - started) * 1000.0
                    if r.status_code != 200:
                        raise RuntimeError(f"{op} failed: {r.status_code} {r.text}")
                    if i >= 10:
                        by_path[runtime.native].append(elapsed)
                native, helper = by_path[True], by_path[False]
                results += [
                    _summary(f"files_{op}_native", native, path="launcher fs"),
                    _summary(f"files_{op}_helper", helper, path="helper.py"),
                    {
                        "bench": "runtime",
                        "mode": f"files_{op}_ratio",
                        "native_over_helper_p50": round(
                            statistics.median(native) / statistics.median(helper), 3
                        ),
                    },
                ]
    finally:
        await agent.stop("files")
    return results


async def run(
    sequential: int,
    concurrency: int,
    rounds: int,
    idle: int,
    execs: int,
    warm: int,
    files: int,
    only: str | None,
) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    cgroups = detect(f"corral-bench-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    with tempfile.TemporaryDirectory(prefix="corral-bench-") as root:
        runtime = ProcessRuntime(Path(root), cgroup_root=cgroups)
        try:
            if only != "files":
                results += await run_exec(Path(root), cgroups, execs, warm)
            if only != "exec" and files:
                results += await run_files(Path(root), cgroups, files)
            if only is not None:
                return results
            # Warm the page cache for bwrap, nsenter and sleep so the first sample is not an outlier.
            await _create_to_first_exec(runtime, "warm")
            await runtime.stop("warm")

            samples = []
            stops = []
            for i in range(sequential):
                samples.append(await _create_to_first_exec(runtime, f"seq-{i}"))
                started = time.perf_counter()
                await runtime.stop(f"seq-{i}")
                stops.append((time.perf_counter() - started) * 1000.0)
            results.append(_summary("sequential", samples))
            results.append(_summary("stop", stops))

            samples = []
            for r in range(rounds):
                ids = [f"conc-{r}-{i}" for i in range(concurrency)]
                samples += await asyncio.gather(*(_create_to_first_exec(runtime, sid) for sid in ids))
                await asyncio.gather(*(runtime.stop(sid) for sid in ids))
            results.append(_summary("concurrent", samples, concurrency=concurrency, rounds=rounds))

            samples = []
            await runtime.start(SandboxSpec(id="exec", memory_mb=256))
            for _ in range(sequential):
                started = time.perf_counter()
                await runtime.exec("exec", ["true"])
                samples.append((time.perf_counter() - started) * 1000.0)
            await runtime.stop("exec")
            results.append(_summary("exec", samples))

            ids = [f"idle-{i}" for i in range(idle)]
            for sid in ids:
                await runtime.start(SandboxSpec(id=sid, memory_mb=256))
            resident = [await runtime.resident_mb(sid) or 0 for sid in ids]
            pss = [_pss_mb(runtime, sid) for sid in ids]
            for sid in ids:
                await runtime.stop(sid)
            results.append(
                {
                    "bench": "runtime",
                    "mode": "overhead",
                    "n": idle,
                    "pss_mb_per_sandbox": round(statistics.mean(pss), 2),
                    "cgroup_mb_per_sandbox": round(statistics.mean(resident), 2),
                    "cgroup": cgroups is not None,
                }
            )
        finally:
            await _stop_all(runtime, cgroups)
    return results


_WARM_BATCH = 5  # gVisor sandboxes up at once for the warm samples: a small pool, a few hundred MiB


async def run_gvisor(cold: int, warm: int, idle: int) -> list[dict[str, object]]:
    """The gvisor runtime: cold (a container created, then its first command) and warm (started
    ahead, as a warm pool's are: the first command is what a claim waits for), sample by sample in
    turn so that the machine's load lands on both; then what each idle sandbox costs the host: the
    PSS of every process in its cgroup, where runsc starts its Sentry, gofer and stubs."""
    reason = gvisor.unavailable_reason()
    if reason is not None:
        return [{"bench": "runtime", "runtime": "gvisor", "skipped": reason}]
    cgroups = detect(f"corral-bench-gv-{os.getpid()}-{uuid.uuid4().hex[:6]}")
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="corral-bench-gv-") as root:
        runtime = gvisor.GvisorRuntime(Path(root), cgroup_root=cgroups)
        tag = {"runtime": "gvisor", "platform": runtime.platform}
        try:
            await _create_to_first_exec(runtime, "page-cache")  # runsc's binary and the host's libraries
            await runtime.stop("page-cache")
            by_kind: dict[str, list[float]] = {"cold": [], "warm": [], "sentry": [], "runsc_exec": []}
            for first in range(0, max(cold, warm), _WARM_BATCH):
                batch = range(first, min(first + _WARM_BATCH, max(cold, warm)))
                warmed = [f"warm-{i}" for i in batch if i < warm]
                for sid in warmed:  # a pool's worth, started ahead and left to settle
                    await runtime.start(SandboxSpec(id=sid, memory_mb=256))
                await asyncio.sleep(runtime.memory_settle_s)
                for i in batch:
                    if i < cold:
                        by_kind["cold"].append(await _create_to_first_exec(runtime, f"cold-{i}"))
                        await runtime.stop(f"cold-{i}")
                    if i < warm:
                        by_kind["warm"].append(await _timed_exec(runtime, f"warm-{i}"))
                        # Then, on the same sandbox, a command through the Sentry's control socket
                        # beside one through ``runsc exec`` (the path every command took before).
                        by_kind["sentry"].append(await _timed_exec(runtime, f"warm-{i}"))
                        by_kind["runsc_exec"].append(await _timed_runsc_exec(runtime, f"warm-{i}"))
                for sid in warmed:
                    await runtime.stop(sid)
            if cold:
                results.append(_summary("gvisor_cold_first_exec", by_kind["cold"], **tag))
            if warm:
                results.append(_summary("gvisor_warm_first_exec", by_kind["warm"], **tag))
                sentry_ms, runsc_ms = by_kind["sentry"], by_kind["runsc_exec"]
                results += [
                    _summary("gvisor_exec_sentry", sentry_ms, path="control socket", **tag),
                    _summary("gvisor_exec_runsc_exec", runsc_ms, path="runsc exec", **tag),
                    {
                        "bench": "runtime",
                        "mode": "gvisor_exec_ratio",
                        "sentry_over_runsc_exec_p50": round(
                            statistics.median(sentry_ms) / statistics.median(runsc_ms), 3
                        ),
                    },
                ]
            ids = [f"idle-{i}" for i in range(idle)]
            for sid in ids:
                await runtime.start(SandboxSpec(id=sid, memory_mb=256))
                await _timed_exec(runtime, sid)  # booted and answering, then left idle
            await asyncio.sleep(runtime.memory_settle_s)
            pids = [runtime.host_pids(sid) for sid in ids]
            if ids:
                results.append(
                    {
                        "bench": "runtime",
                        "mode": "gvisor_overhead",
                        "n": idle,
                        "pss_mb_per_sandbox": round(statistics.mean(_pss_of(p) for p in pids), 2),
                        "processes_per_sandbox": round(statistics.mean(len(p) for p in pids), 1),
                        "cgroup_mb_per_sandbox": round(
                            statistics.mean([await runtime.resident_mb(sid) or 0 for sid in ids]), 2
                        ),
                        **tag,
                    }
                )
        finally:
            await _stop_all(runtime, cgroups)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--sequential", type=int, default=50)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--idle", type=int, default=20)
    parser.add_argument("--execs", type=int, default=200, help="exec round trips per path")
    parser.add_argument("--warm", type=int, default=30, help="warm sandboxes' first execs per path")
    parser.add_argument("--files", type=int, default=100, help="file operations per path and kind")
    parser.add_argument("--only-exec", action="store_true", help="only the channel/launcher comparisons")
    parser.add_argument("--only-files", action="store_true", help="only the fs mode/helper comparisons")
    parser.add_argument("--no-gvisor", action="store_true", help="the process runtime only")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason is not None:
        print(json.dumps({"bench": "runtime", "skipped": reason}))
    else:
        only = "exec" if args.only_exec else "files" if args.only_files else None
        lines = run(
            args.sequential, args.concurrency, args.rounds, args.idle, args.execs, args.warm, args.files, only
        )
        for line in asyncio.run(lines):
            print(json.dumps(line), flush=True)
    if not (args.no_gvisor or args.only_exec or args.only_files):
        for line in asyncio.run(run_gvisor(args.sequential, args.warm, args.idle)):
            print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
