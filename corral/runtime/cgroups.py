"""Cgroups for sandboxes: memory, CPU and pids limits, on cgroup v1 or v2.

One :class:`CgroupRoot` per runtime: a directory under which every sandbox gets a child cgroup with its
configured limits. On v2 that is one directory with the memory, cpu and pids controllers; on v1 it is
the memory hierarchy's, plus one in each of the cpu, pids and freezer hierarchies where those are mounted and
writable (hybrid hosts). By default each root is created *beneath the agent's own cgroup*, so
sandboxes stay inside whatever budget the host already gave the agent instead of escaping to the top.

| limit  | v1                                        | v2                  |
| ------ | ----------------------------------------- | ------------------- |
| memory | memory.limit_in_bytes (+ memsw)           | memory.max (+ swap) |
| CPU    | cpu.cfs_quota_us / cpu.cfs_period_us      | cpu.max             |
| pids   | pids.max                                  | pids.max            |
| OOM    | memory.oom_control ``oom_kill``           | memory.events       |
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

_MIB = 1024 * 1024
CPU_PERIOD_US = 100_000
_MIN_QUOTA_US = 1_000  # the kernel's floor for a CFS quota
_V2_CONTROLLERS = ("memory", "cpu", "pids")


class CgroupError(Exception):
    """A cgroup could not be created, configured or removed."""


def _read_int(path: Path) -> int:
    raw = path.read_text().strip()
    return 2**63 - 1 if raw == "max" else int(raw)


def _stat_value(path: Path, key: str) -> int:
    for line in path.read_text().splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def cpu_quota_us(cpus: float, period_us: int = CPU_PERIOD_US) -> int:
    """CFS quota per period for ``cpus`` CPUs' worth of time."""
    return max(_MIN_QUOTA_US, round(cpus * period_us))


@dataclass(frozen=True, slots=True)
class SandboxCgroup:
    """One sandbox's cgroup(s). ``version`` is 1 or 2; ``path`` is the memory cgroup (v1) or the
    unified one (v2); ``extra`` are, on v1, the sandbox's cgroups in the cpu, pids and freezer hierarchies."""

    path: Path
    version: int
    extra: tuple[Path, ...] = ()

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    @property
    def procs_files(self) -> list[Path]:
        """Every cgroup.procs a process of the sandbox must be written to."""
        return [self.path / "cgroup.procs", *(p / "cgroup.procs" for p in self.extra)]

    def _dirs(self) -> list[Path]:
        return [self.path, *self.extra]

    def _with(self, name: str) -> Path | None:
        """The directory (of ours) that holds the control file ``name``, if any."""
        for directory in self._dirs():
            if (directory / name).exists():
                return directory / name
        return None

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self, limit_mb: int, *, cpus: float | None = None, pids: int | None = None) -> None:
        made: list[Path] = []
        try:
            for directory in self._dirs():
                directory.mkdir()
                made.append(directory)
        except FileExistsError:
            self._rmdirs(made)
            raise CgroupError(f"cgroup {self.path} already exists") from None
        except OSError as exc:
            self._rmdirs(made)
            raise CgroupError(f"cannot create cgroup {self.path}: {exc.strerror}") from exc
        try:
            self.set_limit(limit_mb)
            if cpus is not None:
                self.set_cpus(cpus)
            if pids is not None:
                self.set_pids(pids)
        except OSError as exc:
            self.remove()
            raise CgroupError(f"cannot set the limits on {self.path}: {exc.strerror}") from exc

    @staticmethod
    def _rmdirs(dirs: list[Path]) -> None:
        for directory in dirs:
            with contextlib.suppress(OSError):
                directory.rmdir()

    def set_cpus(self, cpus: float) -> None:
        """A CFS quota of ``cpus`` CPUs; a no-op where no cpu controller is ours."""
        if self.version == 2:
            target = self._with("cpu.max")
            if target is not None:
                target.write_text(f"{cpu_quota_us(cpus)} {CPU_PERIOD_US}")
            return
        quota = self._with("cpu.cfs_quota_us")
        if quota is not None:
            (quota.parent / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            quota.write_text(str(cpu_quota_us(cpus)))

    def cpu_quota(self) -> tuple[int, int] | None:
        """(quota, period) in microseconds, or None when unlimited or not ours to set."""
        if self.version == 2:
            target = self._with("cpu.max")
            if target is None:
                return None
            quota, period = target.read_text().split()
            return None if quota == "max" else (int(quota), int(period))
        quota_file = self._with("cpu.cfs_quota_us")
        if quota_file is None:
            return None
        quota_us = int(quota_file.read_text())
        return (
            None if quota_us < 0 else (quota_us, int((quota_file.parent / "cpu.cfs_period_us").read_text()))
        )

    def throttled(self) -> tuple[int, int]:
        """(periods throttled, time throttled in microseconds) so far; zeros without a cpu controller."""
        stat_file = self._with("cpu.cfs_quota_us" if self.version == 1 else "cpu.max")
        if stat_file is None:
            return (0, 0)
        stat_path = stat_file.parent / "cpu.stat"
        if self.version == 2:
            return (_stat_value(stat_path, "nr_throttled"), _stat_value(stat_path, "throttled_usec"))
        return (_stat_value(stat_path, "nr_throttled"), _stat_value(stat_path, "throttled_time") // 1000)

    def set_pids(self, limit: int) -> None:
        target = self._with("pids.max")
        if target is not None:
            target.write_text(str(limit))

    def pids_limit(self) -> int | None:
        target = self._with("pids.max")
        return None if target is None else _read_int(target)

    def oom_kills(self) -> int:
        """Processes the OOM killer killed in this cgroup because of its memory limit."""
        try:
            if self.version == 2:
                return _stat_value(self.path / "memory.events", "oom_kill")
            return _stat_value(self.path / "memory.oom_control", "oom_kill")
        except OSError:
            return 0

    def set_limit(self, limit_mb: int) -> None:
        limit = str(limit_mb * _MIB)
        if self.version == 2:
            (self.path / "memory.max").write_text(limit)
            swap = self.path / "memory.swap.max"
            if swap.exists():
                swap.write_text("0")  # the limit means RAM; swapping past it would hide the breach
            return
        (self.path / "memory.limit_in_bytes").write_text(limit)
        memsw = self.path / "memory.memsw.limit_in_bytes"
        if memsw.exists():
            memsw.write_text(limit)  # memsw counts memory+swap; equal to the limit means no swap

    def limit_mb(self) -> int:
        name = "memory.max" if self.version == 2 else "memory.limit_in_bytes"
        return _read_int(self.path / name) // _MIB

    def working_set_bytes(self) -> int:
        """Usage minus inactive file cache: what the kernel could not reclaim cheaply."""
        if self.version == 2:
            usage = _read_int(self.path / "memory.current")
            inactive = _stat_value(self.path / "memory.stat", "inactive_file")
        else:
            usage = _read_int(self.path / "memory.usage_in_bytes")
            inactive = _stat_value(self.path / "memory.stat", "total_inactive_file")
        return max(0, usage - inactive)

    def pids(self) -> list[int]:
        try:
            text = self.procs_file.read_text()
        except FileNotFoundError:
            return []
        return [int(line) for line in text.split()]

    def _freezer(self) -> tuple[Path, str, str] | None:
        """The control file that freezes the sandbox, with its frozen and thawed values."""
        v2 = self._with("cgroup.freeze")
        if v2 is not None:
            return v2, "1", "0"
        v1 = self._with("freezer.state")
        return (v1, "FROZEN", "THAWED") if v1 is not None else None

    def can_freeze(self) -> bool:
        return self._freezer() is not None

    def freeze(self, *, timeout_s: float = 5.0) -> None:
        """Stop every process of the sandbox where it stands (memory kept), until :meth:`thaw`."""
        found = self._freezer()
        if found is None:
            raise CgroupError(f"cgroup {self.path} has no freezer")
        control, frozen, _ = found
        control.write_text(frozen)
        # v1 reports FREEZING until every task has stopped; v2 flips cgroup.events' "frozen".
        events = control.with_name("cgroup.events")
        deadline = time.monotonic() + timeout_s
        while not self._settled(control, events, frozen):
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {self.path} did not freeze")
            time.sleep(0.002)

    @staticmethod
    def _settled(control: Path, events: Path, frozen: str) -> bool:
        if control.name == "freezer.state":
            return control.read_text().strip() == frozen
        return "frozen 1" in events.read_text().splitlines()

    def thaw(self) -> None:
        found = self._freezer()
        if found is not None and found[0].exists():
            found[0].write_text(found[2])

    def frozen(self) -> bool:
        found = self._freezer()
        return found is not None and found[0].read_text().strip() != found[2]

    def kill(self, *, timeout_s: float = 5.0) -> None:
        """SIGKILL everything in the cgroup until it is empty (v1 has no ``cgroup.kill``)."""
        if not self.exists():
            return
        # A frozen task cannot act on SIGKILL before it is thawed.
        with contextlib.suppress(OSError):
            self.thaw()
        kill_file = self.path / "cgroup.kill"
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return
            if kill_file.exists():
                with contextlib.suppress(OSError):
                    kill_file.write_text("1")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {self.path} still holds {pids} after SIGKILL")
            time.sleep(0.002)

    def remove(self, *, timeout_s: float = 5.0) -> None:
        """Kill what is left and remove the directories; a missing cgroup is already removed."""
        self.kill(timeout_s=timeout_s)
        for directory in self.extra:
            self._remove_dir(directory, timeout_s)
        self._remove_dir(self.path, timeout_s)

    def _remove_dir(self, directory: Path, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                directory.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                # EBUSY while the last killed task finishes exiting.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise CgroupError(f"cannot remove cgroup {directory}: {exc.strerror}") from exc
                self.kill(timeout_s=timeout_s)
                time.sleep(0.002)


@dataclass(frozen=True, slots=True)
class CgroupRoot:
    """The directory that holds one runtime's sandbox cgroups (plus, on v1, its cpu and pids twins)."""

    path: Path
    version: int
    extra: tuple[Path, ...] = ()

    def child(self, name: str) -> SandboxCgroup:
        return SandboxCgroup(self.path / name, self.version, tuple(p / name for p in self.extra))

    def remove_if_empty(self) -> bool:
        """Remove the root once no sandbox cgroup is left under it; True when it is gone."""
        gone = True
        for directory in [*self.extra, self.path]:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                gone = False
        return gone

    @classmethod
    def at(cls, path: Path, extra: tuple[Path, ...] = ()) -> CgroupRoot:
        """An explicit root; created if missing. v2 is recognised by its ``cgroup.controllers``."""
        path.mkdir(parents=True, exist_ok=True)
        version = 2 if (path / "cgroup.controllers").exists() else 1
        if version == 1 and not (path / "memory.limit_in_bytes").exists():
            raise CgroupError(f"{path} is not in a memory cgroup hierarchy")
        if version == 2:
            _enable_v2(path)
        if not os.access(path, os.W_OK):
            raise CgroupError(f"{path} is not writable")
        return cls(path, version, extra)


def _enable_v2(path: Path) -> None:
    """Delegate memory (required), cpu and pids (where the host allows) to the sandboxes below."""
    offered = (path / "cgroup.controllers").read_text().split()
    if "memory" not in offered:
        # Ask the parent; refused when the parent holds processes (no internal tasks).
        with contextlib.suppress(OSError):
            (path.parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in _V2_CONTROLLERS))
        offered = (path / "cgroup.controllers").read_text().split()
    if "memory" not in offered:
        raise CgroupError(f"the memory controller is not available at {path}")
    subtree = path / "cgroup.subtree_control"
    wanted = [c for c in _V2_CONTROLLERS if c in offered]
    if set(wanted) <= set(subtree.read_text().split()):
        return
    try:
        subtree.write_text(" ".join(f"+{c}" for c in wanted))
    except OSError:
        # One controller the host will not delegate must not cost the memory limit.
        try:
            subtree.write_text("+memory")
        except OSError as exc:
            raise CgroupError(f"cannot enable the memory controller below {path}: {exc.strerror}") from exc


def _v1_twin(path: Path, marker: str) -> Path | None:
    """A writable root in a v1 cpu or pids hierarchy (recognised by ``marker``), or None."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    if (path / marker).exists() and os.access(path, os.W_OK):
        return path
    with contextlib.suppress(OSError):
        path.rmdir()
    return None


def _mounts() -> list[tuple[str, str, str, str]]:
    """(mount point, root inside the hierarchy, filesystem type, super options) per cgroup mount."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        fstype, _source, options = [*right.split(), "", "", ""][:3]
        if fstype in ("cgroup", "cgroup2"):
            found.append((fields[4], fields[3], fstype, options))
    return found


def _under(mountpoint: str, mount_root: str, own: str) -> Path | None:
    """Where this process's cgroup ``own`` appears below a mount of (part of) its hierarchy."""
    root = mount_root.rstrip("/")
    if own != root and not own.startswith(root + "/"):
        return None  # the mount shows another part of the hierarchy
    return Path(mountpoint + own[len(root) :].rstrip("/"))


def _own_paths() -> dict[str, str]:
    """Controller (or ``""`` for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _hid, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def detect(leaf: str = "corral") -> CgroupRoot | None:
    """A writable cgroup root beneath this process's own cgroup, or None when there is none.

    v1's memory controller is preferred when it is mounted (hybrid hosts keep it there), with the cpu
    and pids hierarchies beside it when they are writable; otherwise v2,
    if the memory controller can be delegated to ``leaf`` below our own cgroup or, failing that, at
    the top of the v2 mount.
    """
    own = _own_paths()
    v1: list[Path] = []
    v2: list[Path] = []
    twins: dict[str, Path] = {}  # v1 cpu and pids roots, when those hierarchies are mounted
    for mountpoint, mount_root, fstype, options in _mounts():
        controllers = options.split(",")
        if fstype == "cgroup" and "memory" in controllers and "memory" in own:
            base = _under(mountpoint, mount_root, own["memory"])
            v1 += [base / leaf] if base is not None else []
        elif fstype == "cgroup2" and "" in own:
            base = _under(mountpoint, mount_root, own[""])
            v2 += [base / leaf] if base is not None else []
            # On v2 our own cgroup cannot delegate memory while it holds our own process (no
            # internal processes); the top of the mount can, for root. Tried last.
            v2.append(Path(mountpoint) / leaf)
        for controller in ("cpu", "pids", "freezer"):
            if fstype == "cgroup" and controller in controllers and controller in own:
                base = _under(mountpoint, mount_root, own[controller])
                if base is not None:
                    twins.setdefault(controller, base / leaf)
    for path in v1:
        try:
            root = CgroupRoot.at(path)
        except (CgroupError, OSError):
            with contextlib.suppress(OSError):
                path.rmdir()
            continue
        marks = {"cpu": "cpu.cfs_quota_us", "pids": "pids.max", "freezer": "freezer.state"}
        extra = [_v1_twin(twin, marks[name]) for name, twin in sorted(twins.items())]
        return CgroupRoot(root.path, 1, tuple(p for p in extra if p is not None))
    for path in v2:
        try:
            return CgroupRoot.at(path)
        except (CgroupError, OSError):
            # Clean up only a directory this attempt created and left empty.
            with contextlib.suppress(OSError):
                path.rmdir()
            continue
    return None
