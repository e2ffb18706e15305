"""The command lines that build and enter a sandbox: bubblewrap to create its namespaces, nsenter to
run a command inside them, and a one-line shell wrapper that puts a process in the sandbox's cgroup
before it execs (so nothing the sandbox runs is ever outside its limit, not even for a moment).

Pure functions returning argv lists; :func:`probe` is the only one that runs anything.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Host directories a sandbox sees read-only (those that exist on this host). /etc is included so
# that the dynamic loader, CA certificates and resolv.conf work; passwd and group are replaced.
SYSTEM_PATHS: tuple[str, ...] = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")

SANDBOX_HOME = "/home/sandbox"
SANDBOX_UID = 1000
SANDBOX_GID = 1000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# Inside the sandbox only its own user exists, so tools that look the uid up (id, whoami, ssh,
# Python's getpass) work, and the host's account list stays private.
PASSWD = (
    "root:x:0:0:root:/root:/bin/sh\n"
    f"sandbox:x:{SANDBOX_UID}:{SANDBOX_GID}:sandbox:{SANDBOX_HOME}:/bin/sh\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
GROUP = f"root:x:0:\nsandbox:x:{SANDBOX_GID}:\nnogroup:x:65534:\n"


@dataclass(frozen=True, slots=True)
class Layout:
    """Everything about one sandbox's filesystem and namespaces that the command line encodes."""

    hostname: str
    # Descriptors to read the sandbox's passwd and group from: bubblewrap runs as an unprivileged host
    # user that may not be allowed to walk to the runtime's state directory, but can read what it is
    # handed.
    passwd_fd: int
    group_fd: int
    network: bool = False
    system_paths: Sequence[str] = SYSTEM_PATHS


def sandbox_env(hostname: str, *layers: Mapping[str, str] | None) -> dict[str, str]:
    """The environment a sandbox process gets: defaults, then each layer in turn (the spec's, then
    an exec's). Passed as the process environment, never on a command line, where every host user
    could read it in ``ps``."""
    env = base_env(hostname)
    for layer in layers:
        env.update(layer or {})
    return env


def base_env(hostname: str) -> dict[str, str]:
    return {
        "PATH": DEFAULT_PATH,
        "HOME": SANDBOX_HOME,
        "USER": "sandbox",
        "LOGNAME": "sandbox",
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


def sandbox_argv(layout: Layout, init: Sequence[str], *, info_fd: int, bwrap: str = "bwrap") -> list[str]:
    """bubblewrap's command line for a sandbox whose long-lived process is ``init``. bubblewrap writes
    the init's host pid to ``info_fd``; the sandbox prints ``ready`` on stdout when it is set up.

    Deliberately no ``--die-with-parent``: the sandbox must outlive the agent that started it, so a
    restarted agent can re-adopt it. bubblewrap itself is pid 1 inside and reaps orphans there.
    """
    argv = [
        bwrap,
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    argv += ["--share-net"] if layout.network else ["--unshare-net"]
    argv += ["--hostname", layout.hostname, "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_GID)]
    argv += _system_binds(layout.system_paths)
    argv += [
        "--ro-bind-data",
        str(layout.passwd_fd),
        "/etc/passwd",
        "--ro-bind-data",
        str(layout.group_fd),
        "/etc/group",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--perms",
        "1777",
        "--tmpfs",
        "/tmp",
        "--perms",
        "0755",
        "--dir",
        "/home",
        # Home and /tmp are tmpfs: private, gone with the sandbox, and charged to its memory cgroup,
        # so files count against the limit instead of filling a host disk.
        "--perms",
        "0700",
        "--tmpfs",
        SANDBOX_HOME,
        "--chdir",
        SANDBOX_HOME,
        "--new-session",
    ]
    # The shell announces readiness on stdout once every mount is in place and ``init`` is there to
    # run, then becomes ``init``.
    ready = 'command -v "$1" >/dev/null && echo ready && exec "$@"'
    argv += ["--info-fd", str(info_fd), "--", "/bin/sh", "-c", ready, "init", *init]
    return argv


def enter_argv(
    init_pid: int, command: Sequence[str], *, cwd: str | None = None, nsenter: str = "nsenter"
) -> list[str]:
    """nsenter's command line to run ``command`` in every namespace of the sandbox whose init is
    ``init_pid``, as the sandbox user (so it holds no capability there)."""
    return [
        nsenter,
        f"--target={init_pid}",
        "--user",
        "--mount",
        "--pid",
        "--net",
        "--uts",
        "--ipc",
        "--cgroup",
        f"--setuid={SANDBOX_UID}",
        f"--setgid={SANDBOX_GID}",
        f"--wdns={cwd or SANDBOX_HOME}",
        "--",
        *command,
    ]


def wrapped_argv(command: Sequence[str], *, procs_file: Path | None) -> list[str]:
    """``command`` behind a shell that first moves itself into the cgroup, then execs: everything
    ``command`` starts is in the cgroup from its first instruction."""
    if procs_file is None:
        return list(command)
    # $0 is the cgroup.procs file, $$ this shell.
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs_file), *command]


@functools.cache
def probe(host_uid: int = 65534, host_gid: int = 65534) -> str | None:
    """None when bubblewrap can build namespaced sandboxes here, otherwise why it cannot."""
    for tool in ("bwrap", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    command = ["bwrap", "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    as_user = {"user": host_uid, "group": host_gid, "extra_groups": []} if os.geteuid() == 0 else {}
    try:
        done = subprocess.run(command, capture_output=True, timeout=10, check=False, **as_user)  # type: ignore[call-overload]
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap did not run: {exc}"
    if done.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {done.stderr.decode(errors='replace').strip()}"
    return None
