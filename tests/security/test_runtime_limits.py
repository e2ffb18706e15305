"""A tenant cannot take the host's pids, CPU or memory: a fork storm stops at the sandbox's pids limit
while the API keeps answering, a CPU hog is throttled at its quota, and an OOM kill is reported."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from .runtime_serve import Serve

pytestmark = pytest.mark.process


def _cgroup_dir(serve: Serve, sandbox_id: str, marker: str) -> Path:
    """The sandbox's cgroup that holds the control file ``marker`` (v1: one per hierarchy)."""
    for path in serve.cgroup_dirs(sandbox_id):
        if (path / marker).exists():
            return path
    raise AssertionError(f"no cgroup of {sandbox_id} has {marker}")


def _stat(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    raise AssertionError(f"{key} not in {path}")


def test_a_fork_storm_stops_at_the_pids_limit_and_the_api_keeps_answering(serve: Serve) -> None:
    calm = serve.create()
    storm = serve.create(memory_mb=512)
    pids = _cgroup_dir(serve, storm, "pids.max")
    assert (pids / "pids.max").read_text().strip() == "512"  # the default template's limit
    outcome: dict[str, Any] = {}

    def fork_storm() -> None:
        outcome.update(
            serve.exec(
                storm,
                ["sh", "-c", "i=0; while [ $i -lt 3000 ]; do sleep 120 & i=$((i+1)); done; echo all-forked"],
                timeout_s=60,
            )
        )

    thread = threading.Thread(target=fork_storm)
    thread.start()
    try:
        while thread.is_alive():
            assert serve.tenant.get(f"/v1/sandboxes/{storm}").status_code == 200
            assert serve.exec(calm, ["echo", "still here"])["stdout"] == "still here\n"
        thread.join()
        assert "all-forked" not in outcome["stdout"], outcome
        if serve.gvisor:
            # Every guest task costs the host threads of the Sentry's and a stub's, in the same pids
            # cgroup: at the limit the Sentry cannot make one and dies, and the sandbox with it.
            serve.wait_stopped(storm)
            assert serve.exec(calm, ["echo", "after"])["stdout"] == "after\n"
            return
        assert "fork" in outcome["stderr"].lower(), outcome
        assert len((pids / "cgroup.procs").read_text().split()) <= 512
        assert _stat(pids / "pids.events", "max") > 0  # the kernel refused forks at the limit
        assert serve.exec(calm, ["echo", "after"])["stdout"] == "after\n"
    finally:
        serve.delete(storm)
        serve.delete(calm)


_HOG = "for i in 1 2 3 4; do (while :; do :; done) & done; sleep 2; kill 0"


@pytest.mark.parametrize(("cpus", "quota_us"), [(1, 100_000), (0.1, 10_000)])
def test_a_cpu_hog_runs_under_its_quota(serve: Serve, cpus: float, quota_us: int) -> None:
    sid = serve.create(cpus=cpus)
    try:
        cpu = _cgroup_dir(serve, sid, "cpu.stat")
        quota = cpu / ("cpu.cfs_quota_us" if (cpu / "cpu.cfs_quota_us").exists() else "cpu.max")
        assert int(quota.read_text().split()[0]) == quota_us  # cpus' worth of every 100 ms period
        serve.exec(sid, ["sh", "-c", _HOG], timeout_s=30)
        # The kernel enforced the quota over the periods the four busy processes ran.
        assert _stat(cpu / "cpu.stat", "nr_periods") > 0
        if cpus < 1:
            # Four busy processes get more than a tenth of a CPU even on a host others saturate
            # (on an idle two-core host, two whole CPUs): the kernel throttles them at the quota.
            assert _stat(cpu / "cpu.stat", "nr_throttled") > 0
    finally:
        serve.delete(sid)


@pytest.mark.gvisor_subset
def test_an_oom_kill_is_reported_on_the_sandbox_and_in_metrics(serve: Serve) -> None:
    sid = serve.create(memory_mb=64)
    try:
        assert serve.tenant.get(f"/v1/sandboxes/{sid}").json()["oom_kills"] == 0
        hog = serve.exec(sid, ["python3", "-c", "b = bytearray(400 * 1024 * 1024)"])
        if serve.gvisor:
            # The guest's memory is the Sentry's, the cgroup's largest process: the OOM killer takes
            # it, and the whole sandbox ends; it is reported stopped (the host's memory held).
            assert hog["exit_code"] != 0, hog
            serve.wait_stopped(sid)
            return
        assert hog["exit_code"] == 137
        assert hog["oom_killed"] is True and "out-of-memory" in hog["note"]  # said in its answer
        assert serve.exec(sid, ["echo", "survived"])["stdout"] == "survived\n"  # only the hog died
        deadline = time.monotonic() + 30
        while serve.tenant.get(f"/v1/sandboxes/{sid}").json()["oom_kills"] < 1:
            assert time.monotonic() < deadline, "the OOM kill never reached the sandbox's record"
            time.sleep(0.2)
        metrics = serve.admin.get("/metrics").text
        counts = re.findall(r"^corral_agent_sandbox_oom_kills_total\{[^}]*\} (\S+)$", metrics, re.M)
        assert sum(float(c) for c in counts) >= 1
    finally:
        serve.delete(sid)
