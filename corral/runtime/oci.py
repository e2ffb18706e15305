"""The OCI runtime spec of a sandbox (config.json of its bundle) and of each command run in it, as
plain data: what ``runsc`` is handed. Pure: the paths it names are made by the runtime beforehand."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from corral.runtime.bwrap import IMAGE_INIT_PATH, INIT_PATH, SANDBOX_GID, SANDBOX_HOME, SANDBOX_UID

OCI_VERSION = "1.0.2"
# Nothing is granted: the sandbox's user holds no capability, inside gVisor's kernel as outside.
_NO_CAPS: dict[str, list[str]] = {
    k: [] for k in ("bounding", "effective", "inheritable", "permitted", "ambient")
}


def _env_list(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def process(
    args: Sequence[str],
    env: Mapping[str, str],
    cwd: str = SANDBOX_HOME,
    *,
    uid: int = SANDBOX_UID,
    terminal: bool = False,
    no_new_privileges: bool = True,
) -> dict[str, Any]:
    """One process of the sandbox: as its user, without capabilities or new privileges (unless
    ``no_new_privileges`` is False: an image's sandbox, whose setuid ``sudo`` is its root's way in);
    on the terminal its runtime is given as its standard descriptors, if ``terminal``."""
    return {
        "terminal": terminal,
        "user": {"uid": uid, "gid": SANDBOX_GID if uid == SANDBOX_UID else uid},
        "args": list(args),
        "env": _env_list(env),
        "cwd": cwd,
        "capabilities": _NO_CAPS,
        "noNewPrivileges": no_new_privileges,
        "rlimits": [{"type": "RLIMIT_NOFILE", "hard": 1024, "soft": 1024}],
    }


def preload_path(*, image: bool) -> str:
    """Where a gVisor sandbox's statx shim is (see corral/runtime/statx_shim.c): beside corral's init,
    in /dev for an image's root (the image holds no /.corral)."""
    return "/dev/.corral-statx.so" if image else "/.corral/statx.so"


def preload_list(*, image: bool) -> bytes:
    """The /etc/ld.so.preload that loads the shim into every dynamically linked program."""
    return f"{preload_path(image=image)}\n".encode()


def _bind(source: str, destination: str) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "ro", "nosuid", "nodev"],
    }


def _tmpfs(destination: str, size_bytes: int | None, mode: str, owner: int | None = None) -> dict[str, Any]:
    options = ["nosuid", "nodev", f"mode={mode}"]
    if owner is not None:
        options += [f"uid={owner}", f"gid={owner}"]
    if size_bytes is not None:
        options.append(f"size={size_bytes}")
    return {"destination": destination, "type": "tmpfs", "source": "tmpfs", "options": options}


def bundle_config(
    *,
    hostname: str,
    env: Mapping[str, str],
    system_paths: Sequence[str],
    etc_files: Mapping[str, str],
    init_source: str,
    tmpfs_bytes: int | None,
    in_own_cgroups: bool = False,
    netns: str | None = None,
    image_root: str | None = None,
    preload_source: str | None = None,
) -> dict[str, Any]:
    """The sandbox's spec: a read-only empty root with the host's system directories bound read-only
    over it, its generated /etc files (``etc_files``: name inside /etc -> host path), tmpfs home, /tmp
    and /dev/shm sized like the process runtime's, and corral's init as pid 1 (it reaps orphans;
    gVisor's kernel, not the host's, runs it). ``in_own_cgroups``: runsc is started inside the
    sandbox's cgroups, made and limited already. ``netns``: the network slot's namespace, the
    container's (else a new, empty one). ``image_root``: an image sandbox's overlay (see
    corral.runtime.rootfs), its writable root instead, whose own home and /tmp are on its disk, its
    init root inside at IMAGE_INIT_PATH, nothing of the host's system bound in, and new privileges
    allowed (its ``sudo``). ``preload_source``: the statx shim, bound read-only at
    :func:`preload_path` (which the caller's /etc/ld.so.preload names, see :func:`preload_list`)."""
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
    ]
    mounts += [_bind(p, p) for p in system_paths if image_root is None]
    mounts += [_bind(src, f"/etc/{name}") for name, src in sorted(etc_files.items())]
    mounts.append(_tmpfs("/dev/shm", tmpfs_bytes, "1777"))
    if image_root is None:
        mounts += [
            _tmpfs("/tmp", tmpfs_bytes, "1777"),
            _tmpfs(SANDBOX_HOME, tmpfs_bytes, "0700", owner=SANDBOX_UID),  # the sandbox user's own
        ]
    init_path = INIT_PATH if image_root is None else IMAGE_INIT_PATH
    mounts.append(_bind(init_source, init_path))
    if preload_source is not None:
        mounts.append(_bind(preload_source, preload_path(image=image_root is not None)))
    init = process([init_path, "init"], env, "/", no_new_privileges=image_root is None)
    init["user"] = {"uid": SANDBOX_UID, "gid": SANDBOX_GID} if image_root is None else {"uid": 0, "gid": 0}
    linux: dict[str, Any] = {
        "namespaces": [
            *({"type": t} for t in ("pid", "ipc", "uts", "mount")),
            {"type": "network", "path": netns} if netns is not None else {"type": "network"},
        ],
        "maskedPaths": ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"],
        "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus"],
    }
    if in_own_cgroups:
        # A relative path is taken from runsc's own cgroups, and "." is those: the sandbox's, which
        # runsc finds made and uses as they are (it neither limits nor removes a cgroup it did not
        # make), reading their memory limit as the guest's total memory.
        linux["cgroupsPath"] = "."
    return {
        "ociVersion": OCI_VERSION,
        "process": init,
        "root": {"path": image_root, "readonly": False}
        if image_root
        else {"path": "rootfs", "readonly": True},
        "hostname": hostname,
        "mounts": mounts,
        "linux": linux,
    }
