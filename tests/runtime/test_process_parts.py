"""The pure parts of the process runtime: command lines, the state directory, bounded capture, cgroup arithmetic.
No sandbox is started here."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.runtime import bwrap, procfs
from corral.runtime.base import SandboxSpec
from corral.runtime.capture import BoundedBuffer
from corral.runtime.cgroups import CgroupError, CgroupRoot, SandboxCgroup, _under
from corral.runtime.statedir import Corrupt, Running, Starting, StateDir, valid_id


def _layout(**kwargs: object) -> bwrap.Layout:
    return bwrap.Layout(hostname="h1", etc_fds={"passwd": 5, "group": 6}, seccomp_fd=7, **kwargs)  # type: ignore[arg-type]


def test_sandbox_args_isolate_by_default() -> None:
    argv = bwrap.sandbox_args(_layout(), info_fd=9)
    for flag in ("--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net"):
        assert flag in argv
    assert "--disable-userns" in argv
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    assert argv[argv.index("--seccomp") + 1] == "7"
    assert "--share-net" not in argv
    # The sandbox must outlive the agent (re-adoption), so it is never tied to its parent.
    assert "--die-with-parent" not in argv
    assert argv[argv.index("--hostname") + 1] == "h1"
    assert argv[argv.index("--info-fd") + 1] == "9"
    # corral's own init is pid 1: bubblewrap leaves no reaper of its own inside.
    assert "--as-pid-1" in argv
    assert bwrap.init_command() == ["--", bwrap.INIT_PATH, "init"]


def test_sandbox_args_network_when_asked() -> None:
    argv = bwrap.sandbox_args(_layout(network=True), info_fd=9)
    assert "--share-net" in argv and "--unshare-net" not in argv


def test_etc_is_curated_not_the_hosts() -> None:
    argv = bwrap.sandbox_args(_layout(), info_fd=9)
    assert argv[argv.index("/etc/passwd") - 2 : argv.index("/etc/passwd") + 1] == [
        "--ro-bind-data",
        "5",
        "/etc/passwd",
    ]
    binds = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--ro-bind"}
    assert "/etc" not in binds and "/etc/shadow" not in binds
    assert all(not b.startswith("/etc/") or b[5:] in bwrap.HOST_ETC for b in binds)
    files = bwrap.etc_files("box-1")
    assert set(files) == {"passwd", "group", "hosts", "nsswitch.conf"}
    users = [line.split(":")[0] for line in files["passwd"].decode().splitlines()]
    assert users == ["root", bwrap.SANDBOX_USER, "nobody"]
    assert b"box-1" in files["hosts"]


def test_sandbox_env_layers_and_stays_off_every_command_line() -> None:
    env = bwrap.sandbox_env("h1", {"HOME": "/elsewhere", "X": "spec"}, None, {"X": "call"})
    assert env["HOME"] == "/elsewhere" and env["X"] == "call" and env["HOSTNAME"] == "h1"
    assert env["PATH"] == bwrap.DEFAULT_PATH
    argv = bwrap.sandbox_args(_layout(), info_fd=3)
    assert "--setenv" not in argv  # argv is world-readable in ps; the environment is not
    assert bwrap.encode_args(["--a", "b"]) == b"--a\0b\0"


def test_system_paths_bind_only_what_exists(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to("real")
    argv = bwrap.sandbox_args(
        _layout(system_paths=[str(real), str(tmp_path / "link"), str(tmp_path / "missing")]), info_fd=3
    )
    assert ["--ro-bind", str(real), str(real)] == argv[argv.index(str(real)) - 1 : argv.index(str(real)) + 2]
    assert ["--symlink", "real", str(tmp_path / "link")] == argv[
        argv.index("real") - 1 : argv.index("real") + 2
    ]
    assert str(tmp_path / "missing") not in argv


@pytest.mark.parametrize("good", ["a", "sbx-1", "A.b_c-9", "x" * 128])
def test_valid_ids(good: str) -> None:
    assert valid_id(good)


@pytest.mark.parametrize("bad", ["", ".", "..", "-a", ".hidden", "a/b", "a..b", "x" * 129, "a b", "é"])
def test_invalid_ids(bad: str) -> None:
    assert not valid_id(bad)


def test_the_state_directory_round_trips_and_claims_once(tmp_path: Path) -> None:
    statedir = StateDir(tmp_path / "root")
    me = procfs.identify(os.getpid())
    assert me is not None
    statedir.claim("s1", Starting(starter=me, cgroup="/cg/s1", cgroup_version=1))
    with pytest.raises(FileExistsError):
        statedir.claim("s1", Starting(starter=me, cgroup=None, cgroup_version=None))
    assert statedir.load("s1") == Starting(starter=me, cgroup="/cg/s1", cgroup_version=1)
    running = Running(
        spec=SandboxSpec(id="s1", memory_mb=64, hostname="h", env={"A": "1"}, network=True, stateful=True),
        started_at=12.5,
        init=me,
        monitor=me,
        cgroup="/cg/s1",
        cgroup_version=2,
    )
    statedir.commit("s1", running)
    assert statedir.load("s1") == running
    assert not (statedir.dir("s1") / "starting.json").exists()
    assert list(statedir.ids()) == ["s1"]  # staging directories are never listed
    (statedir.dir("s1") / "sandbox.json").write_text("{torn")
    assert isinstance(statedir.load("s1"), Corrupt)
    statedir.discard("s1")
    assert statedir.load("s1") is None and list(statedir.ids()) == []


@given(chunks=st.lists(st.binary(max_size=300), max_size=20), limit=st.integers(min_value=0, max_value=1000))
def test_bounded_buffer_keeps_a_prefix(chunks: list[bytes], limit: int) -> None:
    buffer = BoundedBuffer(limit)
    for chunk in chunks:
        buffer.feed(chunk)
    everything = b"".join(chunks)
    assert bytes(buffer.data) == everything[:limit]
    assert buffer.truncated == (len(everything) > limit)


def _fake_cgroup(tmp_path: Path, version: int, files: dict[str, str]) -> SandboxCgroup:
    path = tmp_path / f"v{version}"
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return SandboxCgroup(path, version)


def test_working_set_v1_subtracts_inactive_file(tmp_path: Path) -> None:
    cgroup = _fake_cgroup(
        tmp_path,
        1,
        {
            "memory.usage_in_bytes": str(300 << 20),
            "memory.stat": f"cache 1\ninactive_file 999\ntotal_inactive_file {100 << 20}\n",
        },
    )
    assert cgroup.working_set_bytes() == 200 << 20


def test_working_set_v2_subtracts_inactive_file(tmp_path: Path) -> None:
    cgroup = _fake_cgroup(
        tmp_path, 2, {"memory.current": str(50 << 20), "memory.stat": f"anon 1\ninactive_file {10 << 20}\n"}
    )
    assert cgroup.working_set_bytes() == 40 << 20


def test_working_set_never_negative(tmp_path: Path) -> None:
    cgroup = _fake_cgroup(tmp_path, 2, {"memory.current": "100", "memory.stat": "inactive_file 500\n"})
    assert cgroup.working_set_bytes() == 0


def test_set_limit_writes_both_memory_and_swap(tmp_path: Path) -> None:
    v1 = _fake_cgroup(tmp_path, 1, {"memory.limit_in_bytes": "0", "memory.memsw.limit_in_bytes": "0"})
    v1.set_limit(64)
    assert (v1.path / "memory.memsw.limit_in_bytes").read_text() == str(64 << 20)
    assert v1.limit_mb() == 64
    v2 = _fake_cgroup(tmp_path, 2, {"memory.max": "max", "memory.swap.max": "max"})
    assert v2.limit_mb() > 1 << 30  # "max" reads as unlimited
    v2.set_limit(128)
    assert v2.limit_mb() == 128 and (v2.path / "memory.swap.max").read_text() == "0"


@pytest.mark.parametrize(
    ("mountpoint", "mount_root", "own", "expected"),
    [
        ("/sys/fs/cgroup/memory", "/", "/agent/x", "/sys/fs/cgroup/memory/agent/x"),
        ("/sys/fs/cgroup/memory", "/", "/", "/sys/fs/cgroup/memory"),
        # A mount of a subtree (as inside a container): the path is relative to that subtree.
        ("/sys/fs/cgroup/memory", "/agent", "/agent/x", "/sys/fs/cgroup/memory/x"),
        ("/sys/fs/cgroup/memory", "/agent", "/agentx/y", None),
    ],
)
def test_own_cgroup_below_a_mount(mountpoint: str, mount_root: str, own: str, expected: str | None) -> None:
    found = _under(mountpoint, mount_root, own)
    assert (str(found) if found else None) == expected


def test_v2_root_delegates_memory_to_its_children(tmp_path: Path) -> None:
    root = tmp_path / "corral"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    found = CgroupRoot.at(root)
    assert found.version == 2
    assert (root / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"
    assert found.child("s1").path == root / "s1"


def test_v2_root_without_memory_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "corral"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu io\n")
    (root / "cgroup.subtree_control").write_text("")
    with pytest.raises(CgroupError, match="memory controller"):
        CgroupRoot.at(root)


def test_a_directory_outside_any_memory_hierarchy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CgroupError, match="not in a memory cgroup"):
        CgroupRoot.at(tmp_path / "plain")
