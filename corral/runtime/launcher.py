"""The sandbox launcher (``launcher.c``): built on first use, and how a command is handed to it.

The launcher is compiled with gcc against libseccomp into a private cache, one binary per source hash,
so an upgraded corral never runs a stale one. The agent runs it as root, so the cache must be a
directory only this user can write: anything else is refused rather than trusted.

A command reaches it as a *spec* on an inherited descriptor (a memfd), never on its
command line or in its environment: NUL-terminated strings, the magic, the working directory, the
argument count and arguments, the environment count and ``KEY=VALUE`` entries.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

SOURCE = Path(__file__).with_name("launcher.c")
SHIM_SOURCE = Path(__file__).with_name("statx_shim.c")
MAGIC = b"corral-exec-1"
# What the fs mode answers to ``fs version``: the request and answer forms it speaks (launcher.c's).
FS_PROTOCOL = "corral-fs-1"
_CFLAGS = ("-O2", "-Wall", "-Wextra", "-Werror")
_LIBS = ("-lseccomp",)
SHIM_CFLAGS = (*_CFLAGS, "-shared", "-fPIC", "-nostdlib")

# What execve accepts: one string is at most MAX_ARG_STRLEN (32 pages, its NUL included), and the
# whole argv plus environment must fit a quarter of the stack limit (2 MiB on an 8 MiB stack).
# The total kept here is well under that, so a refusal is corral's, never the kernel's E2BIG.
MAX_STRING_BYTES = 32 * 4096 - 1
MAX_EXEC_BYTES = 1024 * 1024
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class LauncherUnavailable(Exception):
    """The launcher cannot be built or run here (no compiler, no libseccomp, unsafe cache)."""


class BadCommand(ValueError):
    """A command, environment or working directory the launcher must not be given; ``field`` is
    which of ``command``, ``env`` or ``cwd``."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def cache_dir() -> Path:
    override = os.environ.get("CORRAL_CACHE_DIR")
    if override:
        return Path(override)
    if os.geteuid() == 0:
        return Path("/var/cache/corral")
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "corral"


def _private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise LauncherUnavailable(
            f"{path} must be a directory owned by uid {os.geteuid()}, writable only by it"
        )
    return path


def cache_name(source: Path, name: str, flags: Sequence[str], libs: Sequence[str] = ()) -> str:
    """What a build is called in the cache: an edited source, or other flags, is another build."""
    digest = hashlib.sha256(source.read_bytes())
    digest.update(" ".join((*flags, *libs)).encode())
    return f"{name}-{digest.hexdigest()[:16]}"


def _compiled(source: Path, name: str, flags: Sequence[str], libs: Sequence[str] = ()) -> Path:
    """``source`` compiled into the cache as ``name-<hash of source and flags>``, built now if the
    cache does not hold it yet."""
    target = _private_dir(cache_dir()) / cache_name(source, name, flags, libs)
    if target.exists():
        return target
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise LauncherUnavailable(f"no C compiler (gcc) to build the sandbox's {name}: run make system-deps")
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        built = Path(work) / name
        done = subprocess.run(
            [cc, *flags, "-o", str(built), str(source), *libs],
            capture_output=True,
            env={"PATH": os.defpath, "LANG": "C"},
            check=False,
        )
        if done.returncode != 0:
            why = done.stderr.decode(errors="replace").strip().splitlines()
            raise LauncherUnavailable(
                f"cannot build the sandbox's {name} (needs gcc and libseccomp-dev: make system-deps): "
                + (why[-1] if why else f"exit {done.returncode}")
            )
        built.chmod(0o700)
        os.replace(built, target)  # atomic: concurrent builders each install a complete binary
    return target


@functools.cache
def path() -> Path:
    """The launcher binary for this source, built now if the cache does not hold it yet."""
    return _compiled(SOURCE, "launcher", _CFLAGS, _LIBS)


@functools.cache
def statx_shim() -> Path:
    """The shared object a gVisor sandbox preloads (see ``statx_shim.c``)."""
    return _compiled(SHIM_SOURCE, "statx-shim.so", SHIM_CFLAGS)


@functools.cache
def binary() -> bytes:
    """The launcher's own bytes: its ``init`` mode runs inside each sandbox from a copy of them."""
    return path().read_bytes()


def unavailable_reason() -> str | None:
    try:
        path()
    except (LauncherUnavailable, OSError) as exc:
        return str(exc)
    return None


@functools.cache
def seccomp_bpf() -> bytes:
    """The sandbox's seccomp filter as libseccomp exports it (what bubblewrap's ``--seccomp`` reads)."""
    done = subprocess.run([str(path()), "seccomp"], capture_output=True, env=clean_env(), check=False)
    if done.returncode != 0 or not done.stdout or len(done.stdout) % 8:
        raise LauncherUnavailable(f"the launcher cannot export its seccomp filter: {done.stderr!r}")
    return done.stdout


def clean_env() -> dict[str, str]:
    """The whole environment of every host-side process corral starts: nothing from any request."""
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def check_command(command: Sequence[str], env: Mapping[str, str], cwd: str) -> None:
    """Refuse what execve would refuse (or silently cut), before anything is spawned."""
    if not command:
        raise BadCommand("command must not be empty", "command")
    if not isinstance(cwd, str) or not cwd.startswith("/") or "\0" in cwd or len(cwd.encode()) > 4095:
        raise BadCommand("cwd must be an absolute path without NUL bytes, at most 4095 bytes", "cwd")
    command_bytes = 0
    for part in command:
        if not isinstance(part, str) or "\0" in part:
            raise BadCommand("command must be a list of strings without NUL bytes", "command")
        command_bytes += _string_bytes(part, "command")
    total = command_bytes
    for key, value in env.items():
        if not ENV_NAME.match(key):
            raise BadCommand(
                f"environment variable name {key!r} is invalid: use [A-Za-z_][A-Za-z0-9_]*", "env"
            )
        if "\0" in value:
            raise BadCommand(f"environment variable {key} holds a NUL byte", "env")
        total += _string_bytes(f"{key}={value}", "env")
    if total > MAX_EXEC_BYTES:
        raise BadCommand(
            f"command and environment take {total} bytes; at most {MAX_EXEC_BYTES}",
            "command" if 2 * command_bytes >= total else "env",
        )


def _string_bytes(text: str, field: str) -> int:
    size = len(text.encode()) + 1 + 8  # the string, its NUL and its pointer
    if size - 9 > MAX_STRING_BYTES:
        raise BadCommand(f"an item of {field} is longer than {MAX_STRING_BYTES} bytes", field)
    return size


def encode(command: Sequence[str], env: Mapping[str, str], cwd: str) -> bytes:
    check_command(command, env, cwd)
    items = [MAGIC, cwd.encode(), str(len(command)).encode(), *(part.encode() for part in command)]
    items += [str(len(env)).encode(), *(f"{k}={v}".encode() for k, v in env.items())]
    return b"".join(item + b"\0" for item in items)


def memfd(name: str, data: bytes) -> int:
    """A read-only-from-the-start descriptor holding ``data``, for a child to inherit and read. The
    caller closes it once the child has it."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd
