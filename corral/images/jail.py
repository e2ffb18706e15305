"""The one place image work touches tenant files: a helper process, run as host root, that makes its
mounts in a private mount namespace and then does the work as root of a user namespace whose uids are
an unprivileged host range (``BUILD_UIDS``), never as the host's root.

Three jobs, each read as JSON on stdin (``python -m corral.images.jail``):

- ``step``: a build step. An overlay of the parent layers (read-only) and a fresh upper on a sparse
  ext4 loop disk of the step's disk limit (writes past it are ENOSPC), then bubblewrap with that
  overlay as its root, its own pid, ipc, uts and (unless the step may use the network) net namespaces;
  the upper is copied out as the new layer when the command succeeds.
- ``extract``: tar archives applied in order into a directory, chrooted into it inside the user
  namespace, so every path, symlink and ``..`` of a crafted archive resolves inside that directory;
  device nodes are skipped (mknod is refused there anyway), whiteouts honoured; then the fix-ups
  every image root gets (:func:`fixups`).
- ``pack``: the layers' overlay packed by ``mkfs.erofs`` from inside the user namespace, so the image
  holds the uids the build saw (0 for root), not the host range they are stored under.

Everything the helper mounts lives in its own mount namespace and goes with it; its children are in
its process group and die with it (bubblewrap with ``--die-with-parent``), so killing the group
cancels a step.
"""

from __future__ import annotations

import ctypes

# tarfile imports its compressors when it first meets them, which is after the chroot, where the
# standard library is out of reach: a gzip'd (or xz'd) archive is read with them imported here.
import gzip  # noqa: F401
import json
import lzma  # noqa: F401
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Host uids 0..65535 of every build map here: far from the sandbox runtime's range and below 2^31.
BUILD_UID_BASE = 1_500_000_000
UID_COUNT = 65536
# The exit status of a failure of the helper itself (not of the step's command).
HELPER_FAILED = 125

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(None, use_errno=True)


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare: {os.strerror(err)}")


def _run(argv: Sequence[str]) -> None:
    subprocess.run(list(argv), check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)


def _private_mounts() -> None:
    _unshare(_CLONE_NEWNS)
    _run(["mount", "--make-rprivate", "/"])


# Where the build's root finds what it is given, inside the helper's own mount namespace: a fresh
# tmpfs over a directory every host has, so the paths above the helper's scratch need not be open to
# the build's uids (bubblewrap resolves its sources to full paths).
STAGE = Path("/mnt") if Path("/mnt").is_dir() else Path("/tmp")


def _stage(sources: dict[str, Path]) -> dict[str, Path]:
    """Each source bound at ``STAGE/<name>`` (call in the private mount namespace)."""
    _run(["mount", "-t", "tmpfs", "-o", "mode=0755,size=1m", "corral-stage", str(STAGE)])
    staged = {}
    for name, source in sources.items():
        target = STAGE / name
        target.mkdir()
        _run(["mount", "--rbind", str(source), str(target)])
        staged[name] = target
    return staged


def _overlay(
    lowers: Sequence[str], target: Path, upper: Path | None = None, work: Path | None = None
) -> None:
    """Mount the overlay of ``lowers`` (topmost first) at ``target``; read-only without an upper
    (overlay needs two lowers then: an empty one is added)."""
    lower_list = list(lowers)
    if upper is None and len(lower_list) < 2:
        empty = target.parent / "empty-lower"
        empty.mkdir(exist_ok=True)
        lower_list.append(str(empty))
    options = "lowerdir=" + ":".join(lower_list)
    if upper is not None and work is not None:
        options += f",upperdir={upper},workdir={work}"
    _run(["mount", "-t", "overlay", "overlay", "-o", options, str(target)])
    if upper is None:
        _run(["mount", "-o", "remount,ro,bind", str(target)])


def _enter_userns(uid_base: int) -> None:
    """Continue as root of a new user namespace mapping 0..65535 to ``uid_base``..: the calling
    process forks, and the parent waits for the child and exits with its status."""
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(ready_r)
        os.close(go_w)
        _unshare(_CLONE_NEWUSER)
        os.write(ready_w, b"u")
        if os.read(go_r, 1) != b"g":
            os._exit(HELPER_FAILED)
        os.setresgid(0, 0, 0)
        os.setresuid(0, 0, 0)
        os.setgroups([])
        # A change of uid makes the process undumpable, its /proc/self root's: bubblewrap reads the
        # descriptors it is handed through /proc/self/fd.
        _libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        return
    os.close(ready_w)
    os.close(go_r)
    try:
        if os.read(ready_r, 1) == b"u":
            for name in ("uid_map", "gid_map"):
                Path(f"/proc/{pid}/{name}").write_text(f"0 {uid_base} {UID_COUNT}\n")
            os.write(go_w, b"g")
    finally:
        os.close(go_w)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


# -- step ------------------------------------------------------------------------------------------------


def _step(job: dict[str, Any]) -> int:
    scratch = Path(job["scratch"])
    disk = scratch / "disk.ext4"
    with disk.open("wb") as f:
        f.truncate(int(job["disk_mb"]) << 20)
    _run(["mkfs.ext4", "-q", "-F", "-E", "root_owner=0:0", "-O", "^has_journal", str(disk)])
    _private_mounts()
    mnt = scratch / "disk"
    root = scratch / "root"
    mnt.mkdir()
    root.mkdir()
    _run(["mount", "-o", "loop,nosuid,nodev", str(disk), str(mnt)])
    upper, work = mnt / "upper", mnt / "work"
    upper.mkdir()
    work.mkdir()
    # The layer's root directory belongs to the build's root; the rest is created as the step's uids.
    os.chown(upper, job["uid_base"], job["uid_base"])
    _overlay(job["lowers"], root, upper, work)
    ro_binds = [(Path(source), dest) for source, dest in job.get("ro_binds", [])]
    staged = _stage({"root": root, **{f"ro{i}": source for i, (source, _) in enumerate(ro_binds)}})
    binds = ["--bind", str(staged["root"]), "/"]
    for i, (_, dest) in enumerate(ro_binds):
        binds += ["--ro-bind", str(staged[f"ro{i}"]), dest]
    pid = os.fork()
    if pid == 0:
        try:
            _enter_userns(job["uid_base"])
            os.execvp("bwrap", ["bwrap", *binds, *job["bwrap"]])
        except BaseException as exc:
            print(f"corral: the build sandbox did not start: {exc}", file=sys.stderr, flush=True)
            os._exit(HELPER_FAILED)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        return code if code > 0 else 128 - code
    # The new layer: the upper as it is (whiteouts are overlay's own 0/0 devices; opaque directories
    # its trusted xattrs), copied out beside its final place, renamed by the builder.
    _run(["cp", "-a", "--sparse=always", f"{upper}/.", job["dest"]])
    return 0


# -- extract ---------------------------------------------------------------------------------------------

WHITEOUT_PREFIX = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_UID = UID_COUNT - 1


class ArchiveRefused(Exception):
    """The archive is not one the importer takes (too large, malformed); the message says why."""


def _remove(path: str) -> None:
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def _clear_dir(path: str) -> None:
    if not os.path.isdir(path) or os.path.islink(path):
        return
    for entry in os.listdir(path):
        _remove(os.path.join(path, entry))


def _clean_name(name: str) -> str | None:
    """The member's path relative to the root, or None for the root itself; ``..`` never climbs
    above the root (inside the chroot it could not anyway)."""
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
            continue
        parts.append(part)
    return "/".join(parts) or None


class _Budget:
    def __init__(self, limit_bytes: int) -> None:
        self.limit = limit_bytes
        self.used = 0

    def charge(self, member: tarfile.TarInfo) -> None:
        # A sparse member's size is its apparent size: a 1 TB hole is refused, not written.
        self.used += max(member.size, 0)
        if self.used > self.limit:
            raise ArchiveRefused(
                f"the archive unpacks to more than {self.limit >> 20} MB ({member.name[:200]})"
            )


def _apply_layer(tar: tarfile.TarFile, budget: _Budget, whiteouts: bool) -> None:
    for member in tar:
        name = _clean_name(member.name)
        if name is None:
            continue
        head, _, base = name.rpartition("/")
        if whiteouts and base == OPAQUE:
            _clear_dir("/" + head)
            continue
        if whiteouts and base.startswith(WHITEOUT_PREFIX):
            hidden = _clean_name(f"{head}/{base[len(WHITEOUT_PREFIX) :]}")
            if hidden is not None:  # a whiteout of "/" itself names nothing
                _remove("/" + hidden)
            continue
        if (
            member.ischr()
            or member.isblk()
            or member.isfifo()
            or not (member.isreg() or member.isdir() or member.issym() or member.islnk())
        ):
            continue  # device nodes and other specials: the runtime makes /dev itself
        budget.charge(member)
        member.name = name
        member.uid = member.uid if 0 <= member.uid <= MAX_UID else 65534
        member.gid = member.gid if 0 <= member.gid <= MAX_UID else 65534
        member.uname = member.gname = ""  # numeric owners: the archive's names mean nothing here
        if member.islnk():
            target = _clean_name(member.linkname)
            if target is None:
                continue
            member.linkname = target
        target_path = "/" + name
        if os.path.lexists(target_path) and not (member.isdir() and os.path.isdir(target_path)):
            _remove(target_path)
        tar.extract(member, "/", set_attrs=True, numeric_owner=True, filter="fully_trusted")
    # Directories' modes and times as the archive says (tarfile sets them as it goes).


_SUDOERS = "user ALL=(ALL:ALL) NOPASSWD: ALL\n"


def _append_missing(path: str, line: str) -> None:
    name = line.partition(":")[0] + ":"
    existing = ""
    if os.path.isfile(path):
        with open(path) as f:
            existing = f.read()
    if any(row.startswith(name) for row in existing.splitlines()):
        return
    with open(path, "a") as f:
        f.write(("" if not existing or existing.endswith("\n") else "\n") + line + "\n")


def fixups() -> None:
    """What every image root has, added where missing (run chrooted into the root): the mount points
    the runtime mounts over, a world-writable /tmp, the user ``user`` (uid 1000, home /home/user) and
    passwordless sudo for it."""
    for path, mode in (
        ("/proc", 0o555),
        ("/dev", 0o755),
        ("/sys", 0o555),
        ("/tmp", 0o1777),
        ("/home", 0o755),
        ("/root", 0o700),
        ("/etc/sudoers.d", 0o755),
    ):
        if not os.path.isdir(path):
            _remove(path)
            os.makedirs(path, mode=mode)
    os.chmod("/tmp", 0o1777)
    shell = "/bin/bash" if os.path.exists("/bin/bash") else "/bin/sh"
    _append_missing("/etc/passwd", f"user:x:1000:1000:user:/home/user:{shell}")
    _append_missing("/etc/group", "user:x:1000:")
    if os.path.isfile("/etc/shadow"):
        _append_missing("/etc/shadow", "user:*:19000:0:99999:7:::")
    if not os.path.isdir("/home/user"):
        _remove("/home/user")
        os.makedirs("/home/user", mode=0o755)
        os.chown("/home/user", 1000, 1000)
    _remove("/etc/sudoers.d/user")
    with open("/etc/sudoers.d/user", "w") as f:
        f.write(_SUDOERS)
    os.chmod("/etc/sudoers.d/user", 0o440)


def _extract(job: dict[str, Any]) -> int:
    target = Path(job["target"])
    target.mkdir(parents=True, exist_ok=True)
    os.chown(target, job["uid_base"], job["uid_base"])
    # Every archive, and the target, opened before the chroot: the only ways to files outside it.
    sources = [open(s, "rb") for s in job["sources"]]  # noqa: SIM115
    os.chdir(target)
    _enter_userns(job["uid_base"])
    _unshare(_CLONE_NEWNS)
    os.chroot(".")
    os.chdir("/")
    os.umask(0)
    budget = _Budget(int(job["limit_bytes"]))
    try:
        for source in sources:
            with tarfile.open(fileobj=source, mode="r:*") as tar:
                _apply_layer(tar, budget, whiteouts=bool(job["whiteouts"]))
        if job.get("fixups"):
            fixups()
    except ArchiveRefused as exc:
        print(f"corral: {exc}", file=sys.stderr, flush=True)
        return 3
    except (tarfile.TarError, OSError, EOFError) as exc:
        print(f"corral: the archive cannot be applied: {exc}", file=sys.stderr, flush=True)
        return 4
    return 0


# -- pack ------------------------------------------------------------------------------------------------

# The same layers pack to the same bytes (so the same digest): no random filesystem id, no build time.
_FIXED_UUID = "00000000-0000-0000-0000-000000000000"


def _pack(job: dict[str, Any]) -> int:
    scratch = Path(job["scratch"])
    root = scratch / "root"
    root.mkdir()
    output = scratch / "image.erofs"
    output.touch(0o600)
    for path in (scratch, output):
        os.chown(path, job["uid_base"], job["uid_base"])
    _private_mounts()
    _overlay(job["lowers"], root)
    staged = _stage({"root": root, "out": scratch})
    _enter_userns(job["uid_base"])
    done = subprocess.run(
        [
            "mkfs.erofs",
            "--quiet",
            "-zlz4",
            "-T0",
            f"-U{_FIXED_UUID}",
            str(staged["out"] / output.name),
            str(staged["root"]),
        ],
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return done.returncode


JOBS = {"step": _step, "extract": _extract, "pack": _pack}


def main() -> None:
    job = json.load(sys.stdin)
    try:
        code = JOBS[job["job"]](job)
    except Exception as exc:
        print(f"corral: {job.get('job')} failed: {exc}", file=sys.stderr, flush=True)
        code = HELPER_FAILED
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
