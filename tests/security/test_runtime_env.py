"""The tenant's environment never acts on the host: LD_PRELOAD, LD_LIBRARY_PATH, BASH_ENV, ENV and PATH
in a create's env and in an exec's env, pointing at a library (and scripts and binaries) placed where
host-side helpers would find them, and at the copy the tenant wrote inside its own sandbox.

The library's constructor appends ``uid=... pidns=... exe=...`` to a marker file in /tmp. On the host,
that file must never appear. Inside the sandbox (whose /tmp is its own), the tenant's own processes do
load it, legitimately: their lines show the sandbox user and the sandbox's pid namespace."""

from __future__ import annotations

import base64
import os
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .runtime_serve import Serve, host_pid_ns

pytestmark = pytest.mark.process


_LIBRARY = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char ns[64] = "?", exe[256] = "?", line[512];
    ssize_t n = readlink("/proc/self/ns/pid", ns, sizeof ns - 1);
    if (n > 0) ns[n] = 0;
    n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) exe[n] = 0;
    int len = snprintf(line, sizeof line, "uid=%d pidns=%s exe=%s\n", (int)getuid(), ns, exe);
    int fd = open(MARKER, O_WRONLY | O_CREAT | O_APPEND, 0666);
    if (fd >= 0) { write(fd, line, (size_t)len); close(fd); }
}
"""
# What the host-side helpers link (the launcher, bubblewrap): a library of that name on
# LD_LIBRARY_PATH would be loaded instead of the real one.
_SHADOWED = ("libseccomp.so.2", "libselinux.so.1", "libcap.so.2", "libpcre2-8.so.0")
_SHADOWED_TOOLS = ("sh", "bash", "nsenter", "bwrap", "sleep", "true", "env", "cat", "setpriv", "unshare")


@dataclass
class Trap:
    directory: Path  # on the host, readable by everyone: where a host-side helper would find it
    marker: str  # the same path names the host's /tmp outside and the sandbox's /tmp inside
    library: bytes

    def env(self, *extra_preload: str) -> dict[str, str]:
        preload = " ".join(["/home/user/evil.so", f"{self.directory}/evil.so", *extra_preload])
        return {
            "LD_PRELOAD": preload,
            "LD_LIBRARY_PATH": f"{self.directory}/lib",
            "BASH_ENV": f"{self.directory}/evil.sh",
            "ENV": f"{self.directory}/evil.sh",
            "PATH": f"{self.directory}/bin:/usr/local/bin:/usr/bin:/bin",
        }

    def host_marks(self) -> str:
        try:
            return Path(self.marker).read_text()
        except FileNotFoundError:
            return ""


def _compile(source_dir: Path, marker: str, out: Path) -> None:
    source = source_dir / "evil.c"
    source.write_text(_LIBRARY)
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-O1", f'-DMARKER="{marker}"', "-o", str(out), str(source)], check=True
    )


@pytest.fixture(scope="module")
def trap() -> Iterator[Trap]:
    directory = Path(tempfile.mkdtemp(prefix="corral-trap-", dir="/tmp"))
    marker = f"/tmp/corral-mark-{secrets.token_hex(6)}"
    try:
        directory.chmod(0o755)
        _compile(directory, marker, directory / "evil.so")
        (directory / "lib").mkdir(mode=0o755)
        for name in _SHADOWED:
            shutil.copy(directory / "evil.so", directory / "lib" / name)
        script = f'echo "uid=$(id -u) pidns=$(readlink /proc/self/ns/pid) exe=$0" >> {marker}\n'
        (directory / "evil.sh").write_text(script)
        (directory / "bin").mkdir(mode=0o755)
        for tool in _SHADOWED_TOOLS:
            fake = directory / "bin" / tool
            fake.write_text(f'#!/bin/sh\n{script}exec /usr/bin/{tool} "$@"\n')
            fake.chmod(0o755)
        for path in directory.rglob("*"):
            path.chmod(path.stat().st_mode | 0o444)
        yield Trap(directory, marker, (directory / "evil.so").read_bytes())
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        Path(marker).unlink(missing_ok=True)


def test_the_trap_works_on_the_host(trap: Trap, tmp_path: Path) -> None:
    # The control: the same library, preloaded by a host process, runs its constructor there.
    control = tmp_path / "control-mark"
    _compile(tmp_path, str(control), tmp_path / "control.so")
    subprocess.run(["/bin/true"], env={"LD_PRELOAD": str(tmp_path / "control.so")}, check=True)
    assert f"pidns={host_pid_ns()}" in control.read_text()


def test_no_environment_variable_reaches_a_host_side_process(serve: Serve, trap: Trap) -> None:
    sid = serve.create(env=trap.env())
    try:
        assert trap.host_marks() == "", "a host-side process loaded the tenant's library at create"
        # The tenant plants its library in its own sandbox, then names it by a host path too.
        encoded = base64.b64encode(trap.library).decode()
        planted = serve.exec(sid, ["sh", "-c", f"echo {encoded} | base64 -d > /home/user/evil.so"])
        assert planted["exit_code"] == 0, planted
        through_proc = f"/proc/{serve.init_pid(sid)}/root/home/user/evil.so"
        for command in (["true"], ["sh", "-c", "true"], ["bash", "-c", "true"], "echo $PATH"):
            result = serve.exec(sid, command, env=trap.env(through_proc), cwd="/tmp")
            assert result["exit_code"] == 0, result
        assert trap.host_marks() == "", "a host-side process acted on the tenant's environment"
        # Inside, the tenant's own processes did load it: as the sandbox user, in its namespaces.
        inside = serve.exec(sid, ["cat", trap.marker], env={})
        lines = inside["stdout"].splitlines()
        assert len(lines) >= 4, inside
        pid_ns = serve.exec(sid, ["readlink", "/proc/self/ns/pid"])["stdout"].strip()
        for line in lines:
            fields = dict(item.split("=", 1) for item in line.split())
            assert fields["uid"] == "1000" and fields["pidns"] != host_pid_ns(), line
            # gVisor numbers a namespace's link anew for each reader: only its kind is stable there.
            assert fields["pidns"] == pid_ns or (serve.gvisor and fields["pidns"].startswith("pid:[")), line
    finally:
        serve.delete(sid)


def _scan_host(secret: bytes, stop: threading.Event, found: list[str], seen: list[int], gvisor: bool) -> None:
    """Every host process's command line and environment, over and over until ``stop``. A process
    sandbox's own processes are the host's too, and may hold the tenant's env; ``seen`` gets the
    command's. Under gVisor none of the guest's processes is a host one: every host process is
    searched, the Sentry's included; ``seen`` gets the Sentry's pid."""
    me, host_ns = os.getpid(), host_pid_ns()
    while not stop.is_set():
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
                if gvisor and cmdline.startswith(b"runsc-sandbox"):
                    seen.append(int(entry))
                elif not gvisor and os.readlink(f"/proc/{entry}/ns/pid") != host_ns:
                    if cmdline == b"sleep\x002\x00":  # the command itself, run by the sandbox's init
                        seen.append(int(entry))
                    continue  # a sandbox's own process: the tenant's env is legitimately there
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if secret in cmdline or secret in environ:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))


@pytest.mark.gvisor_subset
def test_the_host_process_table_never_shows_the_tenants_env(serve: Serve) -> None:
    secret = f"tenant-secret-{secrets.token_hex(8)}"
    found: list[str] = []
    seen: list[int] = []
    stop = threading.Event()
    scanner = threading.Thread(
        target=_scan_host, args=(secret.encode(), stop, found, seen, serve.gvisor), daemon=True
    )
    scanner.start()
    try:
        sid = serve.create(env={"CREATE_SECRET": secret})
        try:
            result = serve.exec(
                sid, ["sh", "-c", "sleep 2; echo $CREATE_SECRET $EXEC_SECRET"], env={"EXEC_SECRET": secret}
            )
            assert result["stdout"].split() == [secret, secret]  # it did reach the command inside
        finally:
            serve.delete(sid)
    finally:
        stop.set()
        scanner.join(10)
    assert seen, "the scan ran while the command ran"
    assert found == [], found
