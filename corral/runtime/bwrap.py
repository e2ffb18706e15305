"""The command line that builds a sandbox: bubblewrap, run as the sandbox's own host uid, creating its
namespaces, its filesystem (the host's system directories read-only, a curated /etc, private tmpfs
home and /tmp), dropping every capability, forbidding nested user namespaces and loading the seccomp
filter. Commands are run inside by the launcher (see :mod:`corral.runtime.launcher`).

Pure functions returning argument lists; :func:`probe` is the only one that runs anything.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from corral.runtime import launcher

# Host directories a sandbox sees read-only (those that exist on this host). /etc is not one of them:
# it holds the host's accounts and configuration; the sandbox gets the curated set below.
SYSTEM_PATHS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What of the host's /etc a program needs to run, resolve names and verify certificates.
HOST_ETC: tuple[str, ...] = (
    "resolv.conf",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "alternatives",
    "localtime",
    "timezone",
    "mime.types",
)

# The one user a sandbox has. Its name and home are defined here only.
SANDBOX_USER = "user"
SANDBOX_HOME = f"/home/{SANDBOX_USER}"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The sandbox's pid 1 (the launcher's ``init`` mode), a read-only copy handed to bubblewrap as data:
# the launcher's own path is in the host's private cache, which the sandbox's uid may not reach.
INIT_PATH = "/.corral/init"
# In an image's sandbox, inside bubblewrap's own /dev tmpfs: nothing of the image decides where it goes.
IMAGE_INIT_PATH = "/dev/.corral-init"
# Where bubblewrap mounts into an image's root: made real directories and files first (see
# corral.runtime.rootfs.prepare_mountpoints).
IMAGE_MOUNT_DIRS: tuple[str, ...] = ("proc", "dev", "etc")
IMAGE_MOUNT_FILES: tuple[str, ...] = ("etc/hosts",)
IMAGE_NETWORK_FILES: tuple[str, ...] = ("etc/resolv.conf",)
ROOT_USER = "root"
ROOT_HOME = "/root"

# /proc files that describe the host (its boot line, memory, load, disks, swap, build) and are
# replaced by the sandbox's own view, as lxcfs does for containers; the rest of /proc is the
# sandbox's own already (its pid namespace) or states nothing of the host's configuration.
# Directories of host figures (pressure stall information) are hidden under an empty read-only tmpfs.
PROC_HIDDEN_DIRS: tuple[str, ...] = ("pressure",)
# The fields of /proc/meminfo that free, top, ps and psutil read, in the kernel's order.
_MEMINFO_FIELDS = (
    "MemTotal", "MemFree", "MemAvailable", "Buffers", "Cached", "SwapCached", "Active", "Inactive",
    "Unevictable", "Mlocked", "SwapTotal", "SwapFree", "Dirty", "Writeback", "AnonPages", "Mapped",
    "Shmem", "KReclaimable", "Slab", "SReclaimable", "SUnreclaim", "KernelStack", "PageTables",
    "CommitLimit", "Committed_AS",
)  # fmt: skip


def etc_files(hostname: str) -> dict[str, bytes]:
    """The generated part of the sandbox's /etc: only its own user exists, so tools that look the uid
    up (id, whoami, ssh, Python's getpass) work, and the host's account list stays private."""
    passwd = (
        "root:x:0:0:root:/root:/bin/sh\n"
        f"{SANDBOX_USER}:x:{SANDBOX_UID}:{SANDBOX_GID}:{SANDBOX_USER}:{SANDBOX_HOME}:/bin/sh\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{SANDBOX_USER}:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"
    hosts = f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
    nsswitch = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"
    return {
        "passwd": passwd.encode(),
        "group": group.encode(),
        "hosts": hosts.encode(),
        "nsswitch.conf": nsswitch.encode(),
    }


def proc_files(memory_mb: int) -> dict[str, bytes]:
    """The sandbox's own view of the /proc files that would describe the host: its memory is its
    limit, with no swap (the cgroup allows none); no load, no disks, no swap devices, no boot line
    and no kernel build configuration. Static: a figure that moved would be the host's again."""
    limit_kb = memory_mb * 1024
    full = ("MemTotal", "MemFree", "MemAvailable", "CommitLimit")
    meminfo = "".join(
        f"{name + ':':<16}{limit_kb if name in full else 0:>8} kB\n" for name in _MEMINFO_FIELDS
    )
    return {
        "meminfo": meminfo.encode(),
        "loadavg": b"0.00 0.00 0.00 1/1 1\n",
        "cmdline": b"\n",
        "diskstats": b"",
        "partitions": b"major minor  #blocks  name\n\n",
        "swaps": b"Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n",
        "vmstat": b"",
        "zoneinfo": b"",
        "buddyinfo": b"",
        "config.gz": b"",
    }


@dataclass(frozen=True, slots=True)
class Layout:
    """Everything about one sandbox's filesystem and namespaces that the command line encodes."""

    hostname: str
    # /etc file name -> a descriptor to read it from: bubblewrap runs as the sandbox's host uid, which
    # may not walk to the runtime's private state, but can read what it is handed.
    etc_fds: Mapping[str, int] = field(default_factory=dict)
    seccomp_fd: int | None = None
    # /proc file name -> a descriptor of its replacement (see proc_files); the init binary's descriptor.
    proc_fds: Mapping[str, int] = field(default_factory=dict)
    init_fd: int | None = None
    # The size of each tmpfs the tenant writes (home, /tmp, /dev/shm): its memory limit, which its
    # files are charged to anyway; so df inside states the sandbox's figure, not half the host's RAM,
    # and a file past it is ENOSPC rather than an OOM kill. None: the kernel's default.
    tmpfs_bytes: int | None = None
    network: bool = False
    system_paths: Sequence[str] = SYSTEM_PATHS
    host_etc: Sequence[str] = HOST_ETC
    # An image's sandbox: its root (the overlay, see corral.runtime.rootfs) as a directory descriptor
    # and its user namespace (the sandbox's uid range); the host's system directories stay out.
    root_fd: int | None = None
    userns_fd: int | None = None


def sandbox_env(hostname: str, *layers: Mapping[str, str] | None, user: str = SANDBOX_USER) -> dict[str, str]:
    """The environment a command in the sandbox gets: defaults, then each layer in turn (the spec's,
    then an exec's). Applied by the launcher at the final execve inside, never to a host process."""
    env = base_env(hostname, user)
    for layer in layers:
        env.update(layer or {})
    return env


def base_env(hostname: str, user: str = SANDBOX_USER) -> dict[str, str]:
    home = ROOT_HOME if user == ROOT_USER else SANDBOX_HOME
    return {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "HOSTNAME": hostname,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
    }


def _system_binds(paths: Sequence[str]) -> list[str]:
    argv: list[str] = []
    for path in paths:
        if os.path.islink(path):
            # Merged-/usr hosts: /bin -> usr/bin. Recreate the link rather than bind its target twice.
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    return argv


def _etc_binds(layout: Layout) -> list[str]:
    argv: list[str] = []
    for name in layout.host_etc:
        source = os.path.join("/etc", name)
        if name not in layout.etc_fds and os.path.exists(
            source
        ):  # a generated one replaces it  # follows links: /etc/resolv.conf often points into /run
            argv += ["--ro-bind", source, source]
    for name, fd in sorted(layout.etc_fds.items()):
        argv += ["--ro-bind-data", str(fd), f"/etc/{name}"]
    return argv


def _proc_binds(layout: Layout) -> list[str]:
    argv: list[str] = []
    for name, fd in sorted(layout.proc_fds.items()):
        if os.path.exists(f"/proc/{name}"):  # procfs has no file to bind over where the kernel lacks it
            argv += ["--ro-bind-data", str(fd), f"/proc/{name}"]
    for name in PROC_HIDDEN_DIRS:
        if os.path.isdir(f"/proc/{name}"):
            argv += ["--perms", "0555", "--tmpfs", f"/proc/{name}", "--remount-ro", f"/proc/{name}"]
    return argv


def sandbox_args(layout: Layout, *, info_fd: int) -> list[str]:
    """bubblewrap's options for a sandbox (handed to it with ``--args FD``, so the hostname is on no
    command line). bubblewrap writes the init's host pid to ``info_fd``; the init prints ``ready``
    on stdout when it runs, every mount in place (see :func:`init_command`).

    Deliberately no ``--die-with-parent``: the sandbox must outlive the agent that started it, so a
    restarted agent can re-adopt it. ``--as-pid-1``: corral's init is pid 1 inside and reaps orphans
    there, so bubblewrap leaves no process of its own in the sandbox.
    """
    if layout.root_fd is not None:
        return _image_args(layout, info_fd=info_fd)
    argv = [
        "--as-pid-1",
        "--unshare-user",
        # A second, nested user namespace with a limit of one: no process inside can create another.
        "--disable-userns",
        *_unshare(layout),
    ]
    argv += ["--hostname", layout.hostname, "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    argv += _system_binds(layout.system_paths)
    argv += _etc_binds(layout)
    size = ["--size", str(layout.tmpfs_bytes)] if layout.tmpfs_bytes is not None else []
    argv += [
        "--proc",
        "/proc",
        *_proc_binds(layout),
        "--dev",
        "/dev",
        # Home, /tmp and /dev/shm are tmpfs: private, gone with the sandbox, and charged to its memory
        # cgroup, so files count against the limit instead of filling a host disk.
        "--perms",
        "1777",
        *size,
        "--tmpfs",
        "/dev/shm",
        "--perms",
        "1777",
        *size,
        "--tmpfs",
        "/tmp",
        "--perms",
        "0755",
        "--dir",
        "/home",
        "--perms",
        "0700",
        *size,
        "--tmpfs",
        SANDBOX_HOME,
        "--chdir",
        SANDBOX_HOME,
        "--new-session",
    ]
    return argv + _init_args(layout, INIT_PATH, info_fd)


def _image_args(layout: Layout, *, info_fd: int) -> list[str]:
    """An image's sandbox: the user namespace is the runtime's (made with the sandbox's uid range,
    nested ones already forbidden in it), the root is the image's overlay, and home and /tmp are on
    its disk. bubblewrap runs its init as uid 0 inside, without capabilities."""
    assert layout.userns_fd is not None
    argv = [
        "--as-pid-1",
        "--userns",
        str(layout.userns_fd),
        "--assert-userns-disabled",
        *_unshare(layout),
    ]
    argv += ["--hostname", layout.hostname, "--bind-fd", str(layout.root_fd), "/"]
    for name, fd in sorted(layout.etc_fds.items()):
        # bubblewrap is root inside here: its files are root's, and must be readable by the user.
        argv += ["--perms", "0644", "--ro-bind-data", str(fd), f"/etc/{name}"]
    if layout.network and "resolv.conf" not in layout.etc_fds and os.path.exists("/etc/resolv.conf"):
        argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
    size = ["--size", str(layout.tmpfs_bytes)] if layout.tmpfs_bytes is not None else []
    argv += ["--proc", "/proc", *_proc_binds(layout), "--dev", "/dev"]
    argv += ["--perms", "1777", *size, "--tmpfs", "/dev/shm", "--chdir", "/", "--new-session"]
    return argv + _init_args(layout, IMAGE_INIT_PATH, info_fd)


def _unshare(layout: Layout) -> list[str]:
    """What every sandbox has of its own besides its user namespace (pids, IPC, hostname, cgroups and,
    unless it has the network, the network), and no capabilities."""
    argv = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--cap-drop", "ALL"]
    return [*argv, "--share-net" if layout.network else "--unshare-net"]


def _init_args(layout: Layout, init_path: str, info_fd: int) -> list[str]:
    """The last of every sandbox's options: corral's init at ``init_path`` (read-only, executable),
    the seccomp filter, and where bubblewrap writes the init's host pid."""
    argv: list[str] = []
    if layout.init_fd is not None:
        argv += ["--perms", "0555", "--ro-bind-data", str(layout.init_fd), init_path]
    if layout.seccomp_fd is not None:
        argv += ["--seccomp", str(layout.seccomp_fd)]
    return [*argv, "--info-fd", str(info_fd)]


def resolv_conf(nameserver: str) -> bytes:
    """A sandbox's /etc/resolv.conf naming its one nameserver (its slot's resolver)."""
    return f"nameserver {nameserver}\noptions timeout:2 attempts:2\n".encode()


def image_etc_files(hostname: str) -> dict[str, bytes]:
    """What of an image's /etc the runtime writes: its hosts (the image keeps its own accounts)."""
    return {"hosts": etc_files(hostname)["hosts"]}


def init_command(image: bool = False, channel_fd: int | None = None) -> list[str]:
    """What follows bubblewrap's options on its own command line (``--args`` carries options only):
    the launcher's ``init``, which announces readiness on stdout, then holds the namespaces open, and
    serves the guest channel listening on ``channel_fd`` if given (see :mod:`corral.runtime.guest`)."""
    channel = ["--channel", str(channel_fd)] if channel_fd is not None else []
    return ["--", IMAGE_INIT_PATH if image else INIT_PATH, "init", *channel]


def encode_args(args: Sequence[str]) -> bytes:
    """The NUL-separated form ``--args FD`` reads."""
    return b"".join(arg.encode() + b"\0" for arg in args)


@functools.cache
def probe(host_uid: int = 65534, host_gid: int = 65534) -> str | None:
    """None when bubblewrap can build namespaced sandboxes here, otherwise why it cannot."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    reason = launcher.unavailable_reason()
    if reason is not None:
        return reason
    command = [
        "bwrap",
        "--as-pid-1",  # bubblewrap 0.3.2 and later; the sandbox's pid 1 is corral's own init
        "--unshare-all",
        "--unshare-user",
        "--disable-userns",
        "--cap-drop",
        "ALL",
        "--ro-bind",
        "/",
        "/",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "true",
    ]
    as_user = {"user": host_uid, "group": host_gid, "extra_groups": []} if os.geteuid() == 0 else {}
    try:
        done = subprocess.run(  # type: ignore[call-overload]
            command, capture_output=True, timeout=10, check=False, env=launcher.clean_env(), **as_user
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run: {exc}"
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None
