"""CPU and pids limits and OOM counts, on v1 (a directory per hierarchy) and v2 (one directory): against
fake control files, then against this host's real cgroups."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.runtime.cgroups import CPU_PERIOD_US, CgroupRoot, SandboxCgroup, cpu_quota_us


def _v1(tmp_path: Path) -> SandboxCgroup:
    """A v1 sandbox: memory, cpu and pids hierarchies, control files as the kernel creates them."""
    memory, cpu, pids = tmp_path / "memory" / "s", tmp_path / "cpu" / "s", tmp_path / "pids" / "s"
    files = {
        memory: {
            "memory.limit_in_bytes": "0",
            "memory.oom_control": "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n",
        },
        cpu: {
            "cpu.cfs_quota_us": "-1",
            "cpu.cfs_period_us": "100000",
            "cpu.stat": "nr_periods 9\nnr_throttled 4\nthrottled_time 7000000\n",
        },
        pids: {"pids.max": "max"},
    }
    for directory, content in files.items():
        directory.mkdir(parents=True)
        for name, text in content.items():
            (directory / name).write_text(text)
    return SandboxCgroup(memory, 1, (cpu, pids))


def _v2(tmp_path: Path) -> SandboxCgroup:
    path = tmp_path / "s"
    path.mkdir()
    content = {
        "memory.max": "max",
        "memory.events": "low 0\nhigh 0\nmax 5\noom 1\noom_kill 1\n",
        "cpu.max": "max 100000",
        "cpu.stat": "usage_usec 10\nnr_periods 3\nnr_throttled 2\nthrottled_usec 1500\n",
        "pids.max": "max",
    }
    for name, text in content.items():
        (path / name).write_text(text)
    return SandboxCgroup(path, 2)


def test_v1_limits_land_in_each_hierarchy(tmp_path: Path) -> None:
    cgroup = _v1(tmp_path)
    assert cgroup.cpu_quota() is None and cgroup.pids_limit() == 2**63 - 1
    cgroup.set_cpus(1.5)
    cgroup.set_pids(300)
    assert (tmp_path / "cpu" / "s" / "cpu.cfs_quota_us").read_text() == "150000"
    assert cgroup.cpu_quota() == (150_000, CPU_PERIOD_US)
    assert (tmp_path / "pids" / "s" / "pids.max").read_text() == "300" and cgroup.pids_limit() == 300
    assert cgroup.throttled() == (4, 7000)
    assert cgroup.oom_kills() == 2
    assert [p.parent.parent.name for p in cgroup.procs_files] == ["memory", "cpu", "pids"]


def test_v2_limits_land_in_one_directory(tmp_path: Path) -> None:
    cgroup = _v2(tmp_path)
    cgroup.set_cpus(0.5)
    cgroup.set_pids(64)
    assert (cgroup.path / "cpu.max").read_text() == f"50000 {CPU_PERIOD_US}"
    assert cgroup.cpu_quota() == (50_000, CPU_PERIOD_US)
    assert cgroup.pids_limit() == 64
    assert cgroup.throttled() == (2, 1500)
    assert cgroup.oom_kills() == 1
    assert cgroup.procs_files == [cgroup.path / "cgroup.procs"]


def test_without_cpu_or_pids_controllers_only_memory_is_limited(tmp_path: Path) -> None:
    path = tmp_path / "s"
    path.mkdir()
    (path / "memory.limit_in_bytes").write_text("0")
    cgroup = SandboxCgroup(path, 1)
    cgroup.set_cpus(2)
    cgroup.set_pids(10)
    assert cgroup.cpu_quota() is None and cgroup.pids_limit() is None and cgroup.throttled() == (0, 0)
    assert cgroup.oom_kills() == 0  # no oom_control to read


@pytest.mark.parametrize(("cpus", "quota"), [(1.0, 100_000), (0.25, 25_000), (4, 400_000), (0.001, 1_000)])
def test_quota_is_cpus_times_the_period_with_the_kernels_floor(cpus: float, quota: int) -> None:
    assert cpu_quota_us(cpus) == quota


def test_real_cgroups_take_every_limit(cgroup_root: CgroupRoot) -> None:
    cgroup = cgroup_root.child("limits-probe")
    cgroup.create(64, cpus=0.5, pids=77)
    try:
        assert cgroup.limit_mb() == 64
        assert cgroup.cpu_quota() == (50_000, CPU_PERIOD_US)
        assert cgroup.pids_limit() == 77
        assert cgroup.oom_kills() == 0 and cgroup.throttled() == (0, 0)
    finally:
        cgroup.remove()
    assert not cgroup.exists() and not any(p.exists() for p in cgroup.extra)
