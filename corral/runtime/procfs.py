"""What /proc says about a process: identity (to tell a live sandbox init from a recycled pid) and
memory (the fallback measurement when no cgroup is writable)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A pid plus what makes it unique over time: its start time (clock ticks after boot) and its pid
    namespace. A recycled pid matches neither."""

    pid: int
    start_ticks: int
    pid_ns: int


def start_ticks(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":
        return None  # a zombie is not a running sandbox
    return int(fields[19])  # field 22 overall: starttime


def parent(pid: int) -> int | None:
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return int(stat[stat.rindex(")") + 2 :].split()[1])  # field 4 overall: ppid


def pid_ns(pid: int) -> int | None:
    try:
        return os.stat(_PROC / str(pid) / "ns" / "pid").st_ino
    except (FileNotFoundError, ProcessLookupError):
        return None


def identify(pid: int) -> ProcessIdentity | None:
    ticks, ns = start_ticks(pid), pid_ns(pid)
    if ticks is None or ns is None:
        return None
    return ProcessIdentity(pid, ticks, ns)


def is_alive(identity: ProcessIdentity) -> bool:
    """Whether ``identity.pid`` is still the very same process (not a zombie, not a reused pid)."""
    return identify(identity.pid) == identity


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in (_PROC / str(pid) / "task" / str(pid) / "children").read_text().split()]
    except OSError:
        return []


def protect_from_oom_killer(pid: int) -> bool:
    """Make ``pid`` about the last the OOM killer picks (oom_score_adj -941). Written through the
    legacy ``oom_adj`` file on purpose: a privileged write to ``oom_score_adj`` also lowers the
    process's floor (``oom_score_adj_min``), which every child it forks inherits, so a tenant's
    command started by the sandbox's init could lower itself past every other tenant's; the legacy
    file sets the score and leaves the floor alone. Best effort: some hosts refuse to lower it, and
    the process may already be gone."""
    try:
        (_PROC / str(pid) / "oom_adj").write_text(str(_LEGACY_OOM_ADJ))
    except OSError:
        return False
    return True


# oom_adj's scale is -17..15; -16 is oom_score_adj -941 (-17 would exempt the process entirely).
_LEGACY_OOM_ADJ = -16


def pids_in_namespace(ns_inode: int) -> list[int]:
    pids = []
    for entry in _PROC.iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "pid").st_ino == ns_inode:
                    pids.append(int(entry.name))
    return pids


def _kib_field(text: str, key: str) -> int | None:
    for line in text.splitlines():
        if line.startswith(key):
            return int(line.split()[1])
    return None


def proportional_kib(pid: int) -> int:
    """Proportional set size (shared pages split among their users), falling back to VmRSS."""
    base = _PROC / str(pid)
    with contextlib.suppress(OSError):
        pss = _kib_field((base / "smaps_rollup").read_text(), "Pss:")
        if pss is not None:
            return pss
    with contextlib.suppress(OSError):
        rss = _kib_field((base / "status").read_text(), "VmRSS:")
        if rss is not None:
            return rss
    return 0


def namespace_resident_bytes(ns_inode: int) -> int:
    return sum(proportional_kib(pid) for pid in pids_in_namespace(ns_inode)) * 1024
