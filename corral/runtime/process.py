"""The ``process`` runtime: each sandbox is a process tree in its own user, pid, mount, network, uts,
ipc and cgroup namespaces (bubblewrap), running as its own host uid, inside cgroups with the sandbox's
memory, CPU and pids limits, without capabilities, new privileges or nested user namespaces, under a
seccomp filter. docs/isolation.md is the threat model.

A sandbox is made of:

* a long-lived init (the launcher's ``init`` mode, pid 1 inside: not dumpable, holding only
  /dev/null, reaping orphans) that holds the namespaces open; every exec joins them through the
  launcher, which alone carries the tenant's command, env and cwd, on a descriptor, to the final
  execve inside;
* cgroups that every process of the sandbox is placed in before it runs its first instruction;
* private tmpfs mounts for its home and /tmp, charged to that cgroup;
* a host uid leased for it alone (see :mod:`corral.runtime.uids`);
* a directory under the runtime's root with the sandbox's record (spec, init identity, cgroups, uid),
  written by the runtime alone: nothing of the sandbox writes to a host file. bubblewrap's stderr is
  a pipe, read only when a start fails and closed once the sandbox is ready.

Sandboxes deliberately outlive the agent that starts them (no ``--die-with-parent``): a restarted agent
re-adopts them from their state directory, after checking that the recorded pid is still that sandbox's init
(same start time, same pid namespace), never a recycled pid.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

from corral.clock import SystemClock
from corral.codes import ErrorCode
from corral.core.clock import Clock
from corral.core.types import MAX_SANDBOX_PIDS, MIN_SANDBOX_PIDS
from corral.exec_result import ExecResult
from corral.runtime import bwrap, child, launcher, procfs
from corral.runtime.base import (
    InvalidSandbox,
    RuntimeFailure,
    SandboxHandle,
    SandboxNotFound,
    SandboxPaused,
    SandboxSpec,
)
from corral.runtime.capture import DEFAULT_LIMIT, BoundedBuffer, drain
from corral.runtime.cgroups import CgroupError, CgroupRoot, SandboxCgroup, detect
from corral.runtime.statedir import Corrupt, Running, Starting, StateDir, valid_id
from corral.runtime.stream import Spawned
from corral.runtime.uids import DEFAULT_LEASE_DIR, DEFAULT_UIDS, UidAllocator, UidsExhausted

DEFAULT_ROOT = Path("/run/corral/sandboxes")
MIN_MEMORY_MB = 16  # bubblewrap, its init and a shell need a few MiB before any workload
NOBODY = 65534
_MIB = 1024 * 1024
_START_TIMEOUT_S = 10.0
_EXIT_GRACE_S = 2.0
_DRAIN_GRACE_S = 0.5
# What a failed start reports of bubblewrap's stderr: what its pipe holds (the kernel's pipe buffer,
# 64 KiB by default, is all it can write unread), cut to this.
_BWRAP_ERROR_BYTES = 64 * 1024
_EXIT_POLL_S = 0.25

# Monitors this Python process spawned and has not reaped yet, by pid. Process-wide on purpose:
# whichever runtime object stops a sandbox (a second one over the same root re-adopts it) reaps
# the child through the Popen that made it, so no Popen is left believing a reaped pid still runs.
_SPAWNED: dict[int, subprocess.Popen[bytes]] = {}
# The sandbox's skeleton (bubblewrap and its init) is the last thing the OOM killer should pick: if it
# went, the whole sandbox would go with it, instead of the one process that overran the limit.
_SKELETON_OOM_SCORE_ADJ = -999


class SandboxExists(RuntimeFailure):
    """A sandbox with this id is already on this host; the existing one is untouched."""

    code = ErrorCode.NAME_CONFLICT


def available(host_uid: int = NOBODY, host_gid: int = NOBODY) -> bool:
    """Whether bubblewrap and namespaces work on this host (``corral serve`` falls back to ``sim``)."""
    return bwrap.probe(host_uid, host_gid) is None


def unavailable_reason(host_uid: int = NOBODY, host_gid: int = NOBODY) -> str | None:
    return bwrap.probe(host_uid, host_gid)


def _exit_code(returncode: int) -> int:
    # Shell convention: killed by signal N -> 128 + N.
    return 128 - returncode if returncode < 0 else returncode


class ProcessRuntime:
    """Real sandboxes on this host. See the module docstring and docs/isolation.md."""

    name = "process"
    # No guest to boot: the memory cgroup counts each page the moment it is touched, so a reading is
    # exact for what the sandbox has done from its first instant. Two agreeing readings suffice.
    memory_settle_s = 0.0

    @staticmethod
    def available(host_uid: int = NOBODY, host_gid: int = NOBODY) -> bool:
        """Whether this runtime can work on this host; see :func:`available`."""
        return available(host_uid, host_gid)

    def __init__(
        self,
        root: Path | None = None,
        *,
        cgroup_root: CgroupRoot | Literal["auto"] | None = "auto",
        uids: range = DEFAULT_UIDS,
        uid_lease_dir: Path = DEFAULT_LEASE_DIR,
        output_limit_bytes: int = DEFAULT_LIMIT,
        system_paths: Sequence[str] = bwrap.SYSTEM_PATHS,
        clock: Clock | None = None,
        cgroup_prefix: str = "",
    ) -> None:
        self.statedir = StateDir(root or DEFAULT_ROOT)
        # None: no writable cgroup here; memory is then read from /proc and the limit is not enforced.
        self.cgroups: CgroupRoot | None = detect() if cgroup_root == "auto" else cgroup_root
        # Hosts on one machine share its cgroup root, and one id may run on two of them (the old copy
        # of a sandbox recreated elsewhere): each host's sandbox cgroups carry its own prefix.
        self._cgroup_tag = cgroup_prefix
        privileged = os.geteuid() == 0
        # Only root can hand a sandbox to a host user of its own; otherwise it runs as ourselves.
        self._uids = UidAllocator(uid_lease_dir, uids, self.statedir.root) if privileged else None
        self._privileged = privileged
        self._output_limit = output_limit_bytes
        self._system_paths = tuple(system_paths)
        # Absolute: the launcher execs it without a PATH search.
        self._bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        self._clock = clock or SystemClock()
        self._me = procfs.identify(os.getpid())
        self._starting: set[str] = set()
        # Monitors of starts in flight, for a failed start to tear down.
        self._launching: dict[str, subprocess.Popen[bytes]] = {}

    # -- start ----------------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        self._validate(spec)
        cgroup = self.cgroups.child(self._cgroup_tag + spec.id) if self.cgroups else None
        assert self._me is not None
        starting = Starting(
            starter=self._me,
            cgroup=str(cgroup.path) if cgroup else None,
            cgroup_version=cgroup.version if cgroup else None,
            cgroup_extra=tuple(str(p) for p in cgroup.extra) if cgroup else (),
        )
        try:
            self.statedir.claim(spec.id, starting)
        except FileExistsError:
            raise SandboxExists(f"sandbox {spec.id!r} already exists") from None
        except OSError as exc:
            raise RuntimeFailure(
                f"cannot record sandbox {spec.id!r} under {self.statedir.root}: {exc}"
            ) from exc
        self._starting.add(spec.id)
        running: Running | None = None
        created: SandboxCgroup | None = None
        uid: int | None = None
        try:
            if self._uids is not None:
                uid = self._uids.acquire(spec.id)  # after the claim: a lease must never predate its record
            if cgroup is not None:
                # Refuses a cgroup that exists: it is not ours to reuse.
                cgroup.create(spec.memory_mb, cpus=spec.cpus, pids=spec.pids)
                created = cgroup
            running = await self._launch(spec, cgroup, uid)
            self.statedir.commit(spec.id, running)
        except BaseException as exc:
            # Whatever this start created goes, whether the failure was ours, bubblewrap's or a cancel.
            init = running.init if running else None
            launched = self._launching.get(spec.id)
            await asyncio.shield(
                asyncio.to_thread(self._teardown, spec.id, init, created, None, launched, uid)
            )
            if isinstance(
                exc, RuntimeFailure | CgroupError | OSError | UidsExhausted | launcher.LauncherUnavailable
            ):
                raise RuntimeFailure(f"sandbox {spec.id!r} did not start: {exc}") from exc
            raise
        finally:
            self._starting.discard(spec.id)
            self._launching.pop(spec.id, None)
        return self._handle(running)

    def _validate(self, spec: SandboxSpec) -> None:
        if not valid_id(spec.id):
            raise InvalidSandbox(
                f"sandbox id {spec.id!r} is invalid: use 1-128 letters, digits, '.', '_' or '-', "
                "starting with a letter or digit",
                "id",
            )
        if spec.memory_mb < MIN_MEMORY_MB:
            raise InvalidSandbox(
                f"memory_mb must be at least {MIN_MEMORY_MB}, got {spec.memory_mb}", "memory_mb"
            )
        if spec.hostname is not None and not (
            0 < len(spec.hostname.encode()) <= 64 and spec.hostname.isprintable()
        ):
            raise InvalidSandbox(
                f"hostname {spec.hostname!r} is invalid: 1-64 printable characters", "hostname"
            )
        if not MIN_SANDBOX_PIDS <= spec.pids <= MAX_SANDBOX_PIDS:
            raise InvalidSandbox(
                f"pids must be between {MIN_SANDBOX_PIDS} and {MAX_SANDBOX_PIDS}, got {spec.pids}", "pids"
            )
        try:
            # The spec's environment is applied at every exec: it must be one an exec can carry.
            launcher.check_command(["true"], bwrap.sandbox_env(spec.id, spec.env), "/")
        except launcher.BadCommand as exc:
            raise InvalidSandbox(str(exc), "env") from None

    async def _launch(self, spec: SandboxSpec, cgroup: SandboxCgroup | None, uid: int | None) -> Running:
        hostname = spec.hostname or spec.id[:64]
        seccomp = launcher.seccomp_bpf()
        fds: list[int] = []
        info_r, info_w = os.pipe()
        try:
            etc_fds: dict[str, int] = {}
            for name, data in bwrap.etc_files(hostname).items():
                etc_fds[name] = launcher.memfd(name, data)
                fds.append(etc_fds[name])  # each closed below, even if a later one fails
            proc_fds: dict[str, int] = {}
            for name, data in bwrap.proc_files(spec.memory_mb).items():
                proc_fds[name] = launcher.memfd(name, data)
                fds.append(proc_fds[name])
            seccomp_fd = launcher.memfd("seccomp", seccomp)
            fds.append(seccomp_fd)
            init_fd = launcher.memfd("init", launcher.binary())
            fds.append(init_fd)
            layout = bwrap.Layout(
                hostname=hostname,
                etc_fds=etc_fds,
                seccomp_fd=seccomp_fd,
                proc_fds=proc_fds,
                init_fd=init_fd,
                tmpfs_bytes=spec.memory_mb * _MIB,
                network=spec.network,
                system_paths=self._system_paths,
            )
            args_fd = launcher.memfd(
                "bwrap-args", bwrap.encode_args(bwrap.sandbox_args(layout, info_fd=info_w))
            )
            fds.append(args_fd)
            # Nothing of the request on this command line or in this environment: the launcher joins
            # the cgroups as root, becomes the sandbox's host uid and execs bubblewrap, which reads
            # its arguments (the hostname among them) from a descriptor.
            host_uid = str(uid if uid is not None else os.getuid())
            host_gid = str(uid if uid is not None else os.getgid())
            procs = [str(p) for p in cgroup.procs_files] if cgroup else []
            argv = [str(launcher.path()), "spawn", host_uid, host_gid, *procs, "--"]
            argv += [self._bwrap, "--args", str(args_fd), *bwrap.init_command()]
            # stderr is a pipe, not a file: the sandbox's init starts with bubblewrap's descriptors,
            # and nothing a sandbox holds may be a host file it could grow.
            monitor = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(info_w, *fds),
                start_new_session=True,  # the agent's terminal signals must not reach sandboxes
                cwd="/",
                env=launcher.clean_env(),
            )
            self._launching[spec.id] = monitor
            _SPAWNED[monitor.pid] = monitor
        finally:
            os.close(info_w)
            for fd in fds:
                os.close(fd)
        assert monitor.stdout is not None and monitor.stderr is not None
        info_pipe = os.fdopen(info_r, "rb", buffering=0)
        try:
            try:
                info = await asyncio.wait_for(_await_ready(info_pipe, monitor.stdout), _START_TIMEOUT_S)
            except TimeoutError:
                why = _read_held(monitor.stderr.fileno(), _BWRAP_ERROR_BYTES)
                raise RuntimeFailure(f"bubblewrap did not report its sandbox in time: {why}") from None
            finally:
                # _await_ready closes them, unless it was cancelled before it ran.
                info_pipe.close()
                monitor.stdout.close()
            if info is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    await asyncio.to_thread(monitor.wait, _EXIT_GRACE_S)
                why = _read_held(monitor.stderr.fileno(), _BWRAP_ERROR_BYTES)
                raise RuntimeFailure(f"bubblewrap failed (exit {monitor.returncode}): {why}")
        finally:
            # Read no further, whatever happened: a later write by bubblewrap's monitor gets EPIPE and
            # stores nothing anywhere.
            monitor.stderr.close()
        init_pid = int(info["child-pid"])
        init = procfs.identify(init_pid)
        monitor_identity = procfs.identify(monitor.pid)
        if init is None or monitor_identity is None or init.pid_ns != int(info["pid-namespace"]):
            raise RuntimeFailure("the sandbox's init exited right after it started")
        if self._privileged:
            for pid in (monitor.pid, init_pid, *procfs.children(init_pid)):
                procfs.set_oom_score_adj(pid, _SKELETON_OOM_SCORE_ADJ)
        return Running(
            spec=spec,
            started_at=self._clock.now(),
            init=init,
            monitor=monitor_identity,
            cgroup=str(cgroup.path) if cgroup else None,
            cgroup_version=cgroup.version if cgroup else None,
            cgroup_extra=tuple(str(p) for p in cgroup.extra) if cgroup else (),
            uid=uid,
        )

    # -- stop -----------------------------------------------------------------------------------

    async def stop(self, sandbox_id: str) -> None:
        record = self.statedir.load(sandbox_id) if valid_id(sandbox_id) else None
        if record is None or sandbox_id in self._starting:
            raise SandboxNotFound(sandbox_id)
        await asyncio.to_thread(self._teardown_record, sandbox_id, record)

    def _teardown_record(self, sandbox_id: str, record: Running | Starting | Corrupt) -> None:
        if isinstance(record, Running):
            self._teardown(sandbox_id, record.init, _cgroup_of(record), record.monitor, None, record.uid)
        elif isinstance(record, Starting):
            # Its uid, if it got one, is not recorded: the lease goes stale with the record.
            self._teardown(sandbox_id, None, _cgroup_of(record), None)
        else:
            self._teardown(sandbox_id, None, self._guess_cgroup(sandbox_id), None)

    def _teardown(
        self,
        sandbox_id: str,
        init: procfs.ProcessIdentity | None,
        cgroup: SandboxCgroup | None,
        monitor: procfs.ProcessIdentity | None,
        launched: subprocess.Popen[bytes] | None = None,
        uid: int | None = None,
    ) -> None:
        """Kill the tree, remove the cgroup, reap, forget. Safe to repeat; runs in a worker thread."""
        popen = launched
        if popen is None and monitor is not None and procfs.identify(monitor.pid) in (monitor, None):
            popen = _SPAWNED.get(monitor.pid)
        if popen is not None:
            _SPAWNED.pop(popen.pid, None)
        # Killing pid 1 of a pid namespace kills every process in it, exec'd ones included.
        if init is not None and procfs.is_alive(init):
            with contextlib.suppress(ProcessLookupError):
                os.kill(init.pid, signal.SIGKILL)
            if cgroup is not None:  # a paused sandbox acts on its SIGKILL only once thawed
                with contextlib.suppress(OSError):
                    cgroup.thaw()
            # Let bubblewrap's monitor reap its init and exit by itself: killing the monitor first
            # would orphan the init to a pid 1 that may never reap it.
            if popen is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    popen.wait(timeout=_EXIT_GRACE_S)
            elif monitor is not None:
                _wait_gone(monitor, _EXIT_GRACE_S)
        if popen is not None and popen.poll() is None:
            # Without a cgroup, an init we never learnt about is found as the monitor's child.
            for child in procfs.children(popen.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        if cgroup is not None:
            cgroup.remove()  # SIGKILLs whatever is left in it, the monitor included
        if popen is not None:
            with contextlib.suppress(ProcessLookupError):
                popen.kill()
            popen.wait()
        elif monitor is not None:
            if procfs.is_alive(monitor):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(monitor.pid, signal.SIGKILL)
            _reap(monitor.pid)
        if uid is not None and self._uids is not None:
            self._uids.release(uid, sandbox_id)  # before the record goes, so it is never reclaimed early
        self.statedir.discard(sandbox_id)

    def _guess_cgroup(self, sandbox_id: str) -> SandboxCgroup | None:
        if self.cgroups is None:
            return None
        cgroup = self.cgroups.child(self._cgroup_tag + sandbox_id)
        return cgroup if cgroup.exists() else None

    # -- exec -----------------------------------------------------------------------------------

    async def exec(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        timeout_s: float = 30.0,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        if not timeout_s > 0:
            raise InvalidSandbox(f"timeout_s must be positive, got {timeout_s}", "timeout_s")
        started = time.monotonic()
        proc = await self._run_in(sandbox_id, command, env, cwd, stdin=False)
        assert proc.stdout is not None and proc.stderr is not None
        out, err = BoundedBuffer(self._output_limit), BoundedBuffer(self._output_limit)
        readers = [asyncio.create_task(drain(proc.stdout, out)), asyncio.create_task(drain(proc.stderr, err))]
        timed_out = paused = killed = False
        try:
            try:
                await asyncio.wait_for(proc.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                paused = self._frozen(sandbox_id)
                killed = True
                await _kill(proc, 0.0 if paused else _EXIT_GRACE_S)
            # A background child that kept the pipes open must not hold the answer hostage: once the
            # command has exited, what is still unread after a short grace is left behind.
            remaining = timeout_s - (time.monotonic() - started)
            _done, pending = await asyncio.wait(readers, timeout=min(_DRAIN_GRACE_S, max(remaining, 0.05)))
            for task in pending:
                task.cancel()
        finally:
            if proc.returncode is None and not killed:
                await _kill(proc, _EXIT_GRACE_S)
            for task in readers:
                task.cancel()
        return ExecResult(
            # Still frozen: it exits with its SIGKILL when the sandbox thaws or stops.
            exit_code=_exit_code(-signal.SIGKILL if proc.returncode is None else proc.returncode),
            stdout=out.text(),
            stderr=err.text(),
            duration_ms=(time.monotonic() - started) * 1000.0,
            truncated=out.truncated or err.truncated,
            timed_out=timed_out,
            note=_exec_note(paused, out, err),
        )

    def _frozen(self, sandbox_id: str) -> bool:
        try:
            return self.paused(sandbox_id)
        except (SandboxNotFound, OSError):
            return False

    async def _run_in(
        self,
        sandbox_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        *,
        stdin: bool,
    ) -> child.Child:
        """The launcher, started on a command for this sandbox (its own process group, so a signal to
        the group reaches everything the command starts)."""
        if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise InvalidSandbox("environment variable names and values must be strings", "env")
        record = self._live(sandbox_id)
        if self.paused(sandbox_id):
            raise SandboxPaused(f"sandbox {sandbox_id!r} is paused")
        hostname = record.spec.hostname or record.spec.id[:64]
        try:
            spec = launcher.encode(
                command, bwrap.sandbox_env(hostname, record.spec.env, env), cwd or bwrap.SANDBOX_HOME
            )
        except launcher.BadCommand as exc:
            raise InvalidSandbox(str(exc), exc.field) from None
        cgroup = _cgroup_of(record)
        # Only the init's identity, the sandbox user's ids and cgroup files on the command line; the
        # command, its environment and cwd travel on the descriptor.
        spec_fd = launcher.memfd("exec-spec", spec)
        init = record.init
        argv = [str(launcher.path()), "exec", str(init.pid), str(init.pid_ns), str(bwrap.SANDBOX_UID)]
        argv += [
            str(bwrap.SANDBOX_GID),
            str(spec_fd),
            *(str(p) for p in (cgroup.procs_files if cgroup else [])),
        ]
        try:
            # Forked off the event loop (see corral.runtime.child): the loop goes on serving.
            return await child.start(argv, env=launcher.clean_env(), pass_fds=(spec_fd,), stdin=stdin)
        finally:
            os.close(spec_fd)

    async def spawn(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
    ) -> Spawned:
        proc = await self._run_in(sandbox_id, command, env, cwd, stdin=stdin)
        assert proc.stdout is not None and proc.stderr is not None

        exited = asyncio.ensure_future(proc.wait())

        async def wait() -> int:
            # asyncio's wait also waits for EOF on the pipes, which never comes while a reader holds
            # back (a full pipe left unread, see corral.agent.envd.processes): the exit is what is waited for.
            while not exited.done() and proc.returncode is None:
                await asyncio.wait({exited}, timeout=_EXIT_POLL_S)
            assert proc.returncode is not None
            return _exit_code(proc.returncode)

        def send(sig: int) -> None:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

        return Spawned(proc.stdout, proc.stderr, proc.stdin, wait, send)

    # -- pause ----------------------------------------------------------------------------------

    def paused(self, sandbox_id: str) -> bool:
        cgroup = _cgroup_of(self._live(sandbox_id))
        return cgroup is not None and cgroup.frozen()

    async def pause(self, sandbox_id: str) -> None:
        """Freeze every process of the sandbox in place; its memory stays where it is."""
        cgroup = _cgroup_of(self._live(sandbox_id))
        if cgroup is None or not cgroup.can_freeze():
            raise RuntimeFailure(f"sandbox {sandbox_id!r} cannot be paused: this host has no cgroup freezer")
        try:
            await asyncio.to_thread(cgroup.freeze)
        except (CgroupError, OSError) as exc:
            with contextlib.suppress(OSError):
                cgroup.thaw()
            raise RuntimeFailure(f"sandbox {sandbox_id!r} did not pause: {exc}") from exc

    async def resume(self, sandbox_id: str) -> None:
        cgroup = _cgroup_of(self._live(sandbox_id))
        if cgroup is not None:
            try:
                cgroup.thaw()
            except OSError as exc:
                raise RuntimeFailure(f"sandbox {sandbox_id!r} did not resume: {exc}") from exc

    # -- inspect --------------------------------------------------------------------------------

    async def resident_mb(self, sandbox_id: str) -> int | None:
        record = self._live(sandbox_id)
        cgroup = _cgroup_of(record)
        try:
            if cgroup is not None:
                used = cgroup.working_set_bytes()
            else:
                used = procfs.namespace_resident_bytes(record.init.pid_ns)
        except OSError:
            return None
        return math.ceil(used / _MIB)

    async def oom_kills(self, sandbox_id: str) -> int:
        cgroup = _cgroup_of(self._live(sandbox_id))
        return 0 if cgroup is None else cgroup.oom_kills()

    async def list(self) -> list[SandboxHandle]:
        """Live sandboxes under this root, including those another runtime object (or an agent that
        has since restarted) started. Leftovers of dead sandboxes and of crashed starts are removed."""
        handles: list[SandboxHandle] = []
        for sandbox_id in self.statedir.ids():
            if sandbox_id in self._starting:
                continue
            record = self.statedir.load(sandbox_id)
            if isinstance(record, Running) and self._is_live(record):
                handles.append(self._handle(record))
            elif isinstance(record, Running | Corrupt) or (
                isinstance(record, Starting) and not procfs.is_alive(record.starter)
            ):
                await asyncio.to_thread(self._teardown_record, sandbox_id, record)
        return handles

    def _live(self, sandbox_id: str) -> Running:
        record = self.statedir.load(sandbox_id) if valid_id(sandbox_id) else None
        if not isinstance(record, Running) or not self._is_live(record):
            raise SandboxNotFound(sandbox_id)
        return record

    @staticmethod
    def _is_live(record: Running) -> bool:
        return procfs.is_alive(record.init)

    @staticmethod
    def _handle(record: Running) -> SandboxHandle:
        return SandboxHandle(
            id=record.spec.id,
            spec=record.spec,
            started_at=record.started_at,
            ref=f"pid={record.init.pid}" + (f" cgroup={record.cgroup}" if record.cgroup else ""),
        )


def _cgroup_of(record: Running | Starting) -> SandboxCgroup | None:
    """The recorded cgroup if it is still there (a start may have crashed before creating it)."""
    if record.cgroup is None or record.cgroup_version is None:
        return None
    cgroup = SandboxCgroup(Path(record.cgroup), record.cgroup_version, tuple(map(Path, record.cgroup_extra)))
    return cgroup if cgroup.exists() else None


async def _await_ready(info: IO[bytes], stdout: IO[bytes]) -> dict[str, int] | None:
    """bubblewrap's --info-fd JSON once the sandbox's init says it is ready, or None if bubblewrap
    exited first (its setup failed; the reason is on its stderr). Closes both pipes, also when
    cancelled.

    The pipes are watched with ``add_reader`` and read here, never handed to a pipe transport: a
    transport closes its file descriptor on its own schedule (uvloop on the next loop turn), and a
    second close of the same number could then close a socket the server has just accepted on it.
    """
    try:
        data = b""
        while True:
            chunk = await _read_some(info.fileno())
            if not chunk:
                return None
            data += chunk
            with contextlib.suppress(ValueError):
                parsed = json.loads(data)
                if isinstance(parsed, dict) and "child-pid" in parsed:
                    break
        line = b""
        while not line.endswith(b"\n"):
            chunk = await _read_some(stdout.fileno())
            if not chunk:
                break
            line += chunk
        return parsed if line == b"ready\n" else None
    finally:
        info.close()
        stdout.close()


async def _read_some(fd: int) -> bytes:
    """Up to 4 KiB from a pipe once it is readable (b"" at its end), without blocking the loop."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return os.read(fd, 4096)


def _read_held(fd: int, limit: int) -> str:
    """What a pipe holds now, at most ``limit`` bytes, without waiting for more."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while len(data) < limit and (chunk := os.read(fd, limit - len(data))):
            data += chunk
    return data.decode(errors="replace").strip() or "no output"


# Launchers killed while their sandbox was frozen, until they exit: a frozen task acts on its
# SIGKILL only once thawed, so an exec's answer never waits for that (the sandbox's resume or stop).
_REAPING: set[asyncio.Future[int]] = set()


async def _kill(proc: child.Child, grace_s: float) -> None:
    """SIGKILL the launcher's process group and wait up to ``grace_s`` for it to be reaped; past that
    it is reaped in the background whenever it exits."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    waiting = asyncio.ensure_future(proc.wait())
    done, _pending = await asyncio.wait({waiting}, timeout=grace_s)
    if not done:
        _REAPING.add(waiting)
        waiting.add_done_callback(_REAPING.discard)


def _exec_note(paused: bool, out: BoundedBuffer, err: BoundedBuffer) -> str | None:
    notes = []
    if paused:
        notes.append(
            "the sandbox was paused while the command ran; it was killed at its timeout and ends "
            "when the sandbox is resumed or stopped"
        )
    for name, buffer in (("stdout", out), ("stderr", err)):
        if buffer.cut_off:
            notes.append(
                f"{name} was cut off after {len(buffer.data) + buffer.dropped} bytes: the command found "
                "its output closed (EPIPE/SIGPIPE)"
            )
    return "; ".join(notes) or None


def _wait_gone(identity: procfs.ProcessIdentity, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while procfs.is_alive(identity) and time.monotonic() < deadline:
        _reap(identity.pid, timeout_s=0)
        time.sleep(0.002)


def _reap(pid: int, timeout_s: float = 5.0) -> None:
    """Collect a killed child of this process, if it is one; another parent reaps its own."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() >= deadline:
            return
        time.sleep(0.002)
