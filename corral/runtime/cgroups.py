"""Memory cgroups for sandboxes, on cgroup v1 (``memory.limit_in_bytes``) or v2 (``memory.max``).

One :class:`CgroupRoot` per runtime: a directory under which every sandbox gets a child cgroup with its
configured limit. By default the root is created *beneath the agent's own memory cgroup*, so sandboxes
stay inside whatever budget the host already gave the agent instead of escaping to the top of the tree.
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


@dataclass(frozen=True, slots=True)
class MemoryCgroup:
    """One sandbox's memory cgroup. ``version`` is 1 or 2."""

    path: Path
    version: int

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def exists(self) -> bool:
        return self.path.is_dir()

    def create(self, limit_mb: int) -> None:
        try:
            self.path.mkdir()
        except FileExistsError:
            raise CgroupError(f"cgroup {self.path} already exists") from None
        except OSError as exc:
            raise CgroupError(f"cannot create cgroup {self.path}: {exc.strerror}") from exc
        try:
            self.set_limit(limit_mb)
        except OSError as exc:
            self.remove()
            raise CgroupError(f"cannot set the memory limit on {self.path}: {exc.strerror}") from exc

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

    def delegate(self, uid: int, gid: int) -> None:
        """Let ``uid`` move its own processes into this cgroup (and only this one), so a launcher
        that already dropped root can still join it before it execs."""
        os.chown(self.procs_file, uid, gid)

    def pids(self) -> list[int]:
        try:
            text = self.procs_file.read_text()
        except FileNotFoundError:
            return []
        return [int(line) for line in text.split()]

    def kill(self, *, timeout_s: float = 5.0) -> None:
        """SIGKILL everything in the cgroup until it is empty (v1 has no ``cgroup.kill``)."""
        if not self.exists():
            return
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
        """Kill what is left and remove the directory; a missing cgroup is already removed."""
        self.kill(timeout_s=timeout_s)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError as exc:
                # EBUSY while the last killed task finishes exiting.
                if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                    raise CgroupError(f"cannot remove cgroup {self.path}: {exc.strerror}") from exc
                self.kill(timeout_s=timeout_s)
                time.sleep(0.002)


@dataclass(frozen=True, slots=True)
class CgroupRoot:
    """The directory that holds one runtime's sandbox cgroups."""

    path: Path
    version: int

    def child(self, name: str) -> MemoryCgroup:
        return MemoryCgroup(self.path / name, self.version)

    def remove_if_empty(self) -> bool:
        """Remove the root once no sandbox cgroup is left under it; True when it is gone."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True

    @classmethod
    def at(cls, path: Path) -> CgroupRoot:
        """An explicit root; created if missing. v2 is recognised by its ``cgroup.controllers``."""
        path.mkdir(parents=True, exist_ok=True)
        version = 2 if (path / "cgroup.controllers").exists() else 1
        if version == 1 and not (path / "memory.limit_in_bytes").exists():
            raise CgroupError(f"{path} is not in a memory cgroup hierarchy")
        if version == 2:
            _enable_memory_v2(path)
        if not os.access(path, os.W_OK):
            raise CgroupError(f"{path} is not writable")
        return cls(path, version)


def _enable_memory_v2(path: Path) -> None:
    if "memory" not in (path / "cgroup.controllers").read_text().split():
        # Ask the parent to delegate it; refused when the parent holds processes (no internal tasks).
        with contextlib.suppress(OSError):
            (path.parent / "cgroup.subtree_control").write_text("+memory")
    if "memory" not in (path / "cgroup.controllers").read_text().split():
        raise CgroupError(f"the memory controller is not available at {path}")
    subtree = path / "cgroup.subtree_control"
    if "memory" not in subtree.read_text().split():
        try:
            subtree.write_text("+memory")
        except OSError as exc:
            raise CgroupError(f"cannot enable the memory controller below {path}: {exc.strerror}") from exc


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
    """A writable memory-cgroup root beneath this process's own cgroup, or None when there is none.

    v1's memory controller is preferred when it is mounted (hybrid hosts keep it there); otherwise v2,
    if the memory controller can be delegated to ``leaf`` below our own cgroup or, failing that, at
    the top of the v2 mount.
    """
    own = _own_paths()
    v1: list[Path] = []
    v2: list[Path] = []
    for mountpoint, mount_root, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options.split(",") and "memory" in own:
            base = _under(mountpoint, mount_root, own["memory"])
            v1 += [base / leaf] if base is not None else []
        elif fstype == "cgroup2" and "" in own:
            base = _under(mountpoint, mount_root, own[""])
            v2 += [base / leaf] if base is not None else []
            # On v2 our own cgroup cannot delegate memory while it holds our own process (no
            # internal processes); the top of the mount can, for root. Tried last.
            v2.append(Path(mountpoint) / leaf)
    candidates = v1 + v2
    for path in candidates:
        try:
            return CgroupRoot.at(path)
        except (CgroupError, OSError):
            # Clean up only a directory this attempt created and left empty.
            with contextlib.suppress(OSError):
                path.rmdir()
            continue
    return None
