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
* or, for a sandbox whose spec names an image: a root of its own, the image's overlay on a disk of its
  ``disk_mb`` (see :mod:`corral.runtime.rootfs`), and a range of host uids mapped from 0 inside, so
  its ``user`` has ``sudo`` to a root that is nobody on the host (see docs/isolation.md);
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
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

from corral.clock import SystemClock
from corral.core.clock import Clock
from corral.core.types import MAX_SANDBOX_PIDS, MIN_SANDBOX_PIDS
from corral.exec_result import ExecResult
from corral.images.resolver import ImageResolver
from corral.runtime import bwrap, child, commands, guest, imageroot, launcher, procfs, rootfs, terminal
from corral.runtime.base import (
    InvalidSandbox,
    RuntimeFailure,
    SandboxExists,
    SandboxHandle,
    SandboxNotFound,
    SandboxPaused,
    SandboxSpec,
    check_timeout,
    shell_exit_code,
)
from corral.runtime.capture import DEFAULT_LIMIT, BoundedBuffer, Capture
from corral.runtime.cgroups import CgroupError, CgroupRoot, SandboxCgroup, detect
from corral.runtime.guestfs import GuestFs
from corral.runtime.statedir import Corrupt, Running, Starting, StateDir, valid_id
from corral.runtime.stream import PtySize, Spawned
from corral.runtime.uids import (
    DEFAULT_LEASE_DIR,
    DEFAULT_UID_RANGES,
    DEFAULT_UIDS,
    RANGE_SPAN,
    UidAllocator,
    UidsExhausted,
    overlaps,
)

DEFAULT_ROOT = Path("/run/corral/sandboxes")
DEFAULT_DISK_ROOT = imageroot.DEFAULT_DISK_ROOT
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


def available(host_uid: int = NOBODY, host_gid: int = NOBODY) -> bool:
    """Whether bubblewrap and namespaces work on this host (``corral serve`` falls back to ``sim``)."""
    return bwrap.probe(host_uid, host_gid) is None


def unavailable_reason(host_uid: int = NOBODY, host_gid: int = NOBODY) -> str | None:
    return bwrap.probe(host_uid, host_gid)


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
        images: ImageResolver | None = None,
        uid_ranges: range = DEFAULT_UID_RANGES,
        disk_root: Path | None = None,
        disk_pool_depth: int = rootfs.DEFAULT_POOL_DEPTH,
        guest_channel: bool = True,
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
        if overlaps(uids, uid_ranges):
            raise ValueError(f"the sandbox uids {uids} overlap the image sandboxes' uid ranges {uid_ranges}")
        self._ranges = UidAllocator(uid_lease_dir, uid_ranges, self.statedir.root) if privileged else None
        # Images: where their files come from, where they are mounted, the pool of writable disks
        # (made on the first image sandbox's start), and the sandboxes whose image this object holds.
        self._root_key = hashlib.sha256(str(self.statedir.root.resolve()).encode()).hexdigest()[:16]
        self._roots = imageroot.ImageRoots(
            images, self.statedir.root, disk_root or DEFAULT_DISK_ROOT / self._root_key, disk_pool_depth
        )
        self._reclaimed = False
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
        # Whether new sandboxes' inits serve the guest channel, and this object's connections to them.
        self._guest_channel = guest_channel
        self._channels: dict[str, guest.Channel] = {}
        # Image sandboxes' command servers being started, one at a time per sandbox.
        self._serving: dict[str, asyncio.Future[str | None]] = {}
        self._guest_fs = GuestFs()

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
            image=spec.image,
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
        span = RANGE_SPAN if spec.image is not None else 1
        try:
            # After the claim: a lease must never predate its record.
            if spec.image is not None and self._ranges is not None:
                uid = self._ranges.acquire(spec.id)
            elif self._uids is not None:
                uid = self._uids.acquire(spec.id)
            if cgroup is not None:
                # Refuses a cgroup that exists: it is not ours to reuse.
                cgroup.create(spec.memory_mb, cpus=spec.cpus, pids=spec.pids)
                created = cgroup
            disk = await self._make_root(spec, uid) if spec.image is not None else None
            running = await self._launch(spec, cgroup, uid, disk)
            self.statedir.commit(spec.id, running)
        except BaseException as exc:
            # Whatever this start created goes, whether the failure was ours, bubblewrap's or a cancel.
            init = running.init if running else None
            launched = self._launching.get(spec.id)
            await asyncio.shield(
                asyncio.to_thread(
                    self._teardown, spec.id, init, created, None, launched, uid, span, spec.image
                )
            )
            if isinstance(
                exc,
                RuntimeFailure
                | CgroupError
                | OSError
                | UidsExhausted
                | launcher.LauncherUnavailable
                | rootfs.RootfsError,
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
        imageroot.refuse_without_image(spec)
        if spec.image is not None:
            imageroot.validate(spec)
            self._roots.require(self._privileged)

    # -- an image sandbox's root ------------------------------------------------------------------

    def _disks(self) -> rootfs.DiskPool:
        """The pool (opening it reclaims: from a worker thread only)."""
        return self._roots.disks()

    def _root_paths(self, sandbox_id: str) -> rootfs.RootPaths:
        return rootfs.RootPaths(
            self.statedir.dir(sandbox_id),
            rootfs.ROOTS_DIR / f"{self._root_key}-{sandbox_id}",
            rootfs.disk_path(self._roots.disk_root, sandbox_id),
        )

    async def _make_root(self, spec: SandboxSpec, base: int | None) -> Path:
        """The image mounted (once), the sandbox's disk taken from the pool, its overlay root made."""
        assert base is not None
        paths = self._root_paths(spec.id)
        await asyncio.to_thread(rootfs.make_entry, paths, base)
        image_mnt = await self._roots.take(spec, paths.disk_dir)
        await asyncio.to_thread(rootfs.make, paths, image_mnt=image_mnt, base=base, span=RANGE_SPAN)
        files = bwrap.IMAGE_MOUNT_FILES + (bwrap.IMAGE_NETWORK_FILES if spec.network else ())
        await asyncio.to_thread(rootfs.prepare_mountpoints, paths.merged, bwrap.IMAGE_MOUNT_DIRS, files, base)
        return paths.disk

    async def fill_disks(self, disk_mb: int = rootfs.DEFAULT_DISK_MB) -> int:
        """Make the pool's disks of ``disk_mb`` ahead (a warm-start optimisation: never required)."""
        return await self._roots.fill(disk_mb)

    async def drain_disks(self) -> None:
        """Unmount and remove the pool's ready disks (at shutdown; a later start makes them again)."""
        await self._roots.drain()

    async def _launch(
        self, spec: SandboxSpec, cgroup: SandboxCgroup | None, uid: int | None, disk: Path | None
    ) -> Running:
        hostname = spec.hostname or spec.id[:64]
        seccomp = launcher.seccomp_bpf()
        image = spec.image is not None
        paths = self._root_paths(spec.id)
        fds: list[int] = []
        info_r, info_w = os.pipe()
        try:
            root_fd = userns_fd = None
            if image:
                root_fd = os.open(paths.merged, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
                fds.append(root_fd)
                userns_fd = os.open(paths.userns, os.O_RDONLY | os.O_CLOEXEC)
                fds.append(userns_fd)
            etc_fds: dict[str, int] = {}
            etc = (bwrap.image_etc_files if image else bwrap.etc_files)(hostname)
            if spec.nameserver is not None:
                etc["resolv.conf"] = bwrap.resolv_conf(spec.nameserver)
            for name, data in etc.items():
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
            # The network slot's namespace, joined by the launcher before it drops to the sandbox's uid.
            netns = ["--netns", str(_opened(spec.netns, fds))] if spec.netns is not None else []
            # The guest channel's listening socket, inherited by the init (an image's sandbox is served
            # by a command server instead, started below: see corral.runtime.commands).
            channel_fd = None
            if self._guest_channel and not image:
                listener = guest.listen(self.statedir.dir(spec.id))
                channel_fd = os.dup(listener.fileno())  # inheritable copy; the socket object closes now
                listener.close()
                fds.append(channel_fd)
            layout = bwrap.Layout(
                hostname=hostname,
                etc_fds=etc_fds,
                seccomp_fd=seccomp_fd,
                proc_fds=proc_fds,
                init_fd=init_fd,
                tmpfs_bytes=spec.memory_mb * _MIB,
                network=spec.network or spec.netns is not None,
                system_paths=self._system_paths,
                root_fd=root_fd,
                userns_fd=userns_fd,
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
            argv = [str(launcher.path()), "spawn", host_uid, host_gid, *netns, *procs, "--"]
            argv += [self._bwrap, "--args", str(args_fd), *bwrap.init_command(image, channel_fd)]
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
            # The sandbox's skeleton (bubblewrap and its init) is the last thing the OOM killer should
            # pick: if it went, the whole sandbox would go with it, not the process that overran.
            for pid in (monitor.pid, init_pid, *procfs.children(init_pid)):
                procfs.protect_from_oom_killer(pid)
        if image:
            # bubblewrap mounts everything nosuid; the image's root must honour its sudo. The user
            # namespace's pin goes too: the sandbox's processes hold it from now on.
            await asyncio.to_thread(rootfs.allow_suid, init.pid, init.pid_ns)
            await asyncio.to_thread(rootfs.unpin_userns, paths)
            if self._guest_channel:
                # Started now, not waited for: a command that comes before it serves takes the
                # launcher (see _channel).
                self._serve(spec.id, init, cgroup)
        return Running(
            spec=spec,
            started_at=self._clock.now(),
            init=init,
            monitor=monitor_identity,
            cgroup=str(cgroup.path) if cgroup else None,
            cgroup_version=cgroup.version if cgroup else None,
            cgroup_extra=tuple(str(p) for p in cgroup.extra) if cgroup else (),
            uid=uid,
            uid_span=RANGE_SPAN if image else 1,
            disk=str(disk) if disk is not None else None,
        )

    # -- stop -----------------------------------------------------------------------------------

    async def stop(self, sandbox_id: str) -> None:
        record = self.statedir.load(sandbox_id) if valid_id(sandbox_id) else None
        if record is None or sandbox_id in self._starting:
            raise SandboxNotFound(sandbox_id)
        await self._forget_channel(sandbox_id)
        await asyncio.to_thread(self._teardown_record, sandbox_id, record)

    def _teardown_record(self, sandbox_id: str, record: Running | Starting | Corrupt) -> None:
        if isinstance(record, Running):
            self._teardown(
                sandbox_id,
                record.init,
                _cgroup_of(record),
                record.monitor,
                None,
                record.uid,
                record.uid_span,
                record.spec.image,
            )
        elif isinstance(record, Starting):
            # Its uid, if it got one, is not recorded: the lease goes stale with the record.
            self._teardown(sandbox_id, None, _cgroup_of(record), None, image=record.image)
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
        span: int = 1,
        image: str | None = None,
    ) -> None:
        """Kill the tree, remove the cgroup, reap, unmount its root, forget. Safe to repeat; runs in a
        worker thread."""
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
        # Every mount of its root, then its disk: the directory is removed only once nothing is
        # mounted in it (an error here leaves it for the next teardown).
        rootfs.unmake(self._root_paths(sandbox_id))
        self._roots.release(sandbox_id, image)
        leases = self._ranges if span > 1 else self._uids
        if uid is not None and leases is not None:
            leases.release(uid, sandbox_id)  # before the record goes, so it is never reclaimed early
        self.statedir.discard(sandbox_id)
        if image is not None and self._privileged:
            self._roots.unmount_unless(image, lambda: self._image_in_use(image))

    def _image_in_use(self, digest: str) -> bool:
        for sandbox_id in self.statedir.ids():
            record = self.statedir.load(sandbox_id)
            if (isinstance(record, Running) and record.spec.image == digest) or (
                isinstance(record, Starting) and record.image == digest
            ):
                return True
        return False

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
        check_timeout(timeout_s)
        started = time.monotonic()
        try:
            # Under the timeout too: a sandbox paused right after the check holds its init's answer.
            proc = await asyncio.wait_for(self._run_in(sandbox_id, command, env, cwd, stdin=False), timeout_s)
        except TimeoutError:
            return ExecResult(
                exit_code=shell_exit_code(-signal.SIGKILL),
                duration_ms=(time.monotonic() - started) * 1000.0,
                timed_out=True,
                note=_PAUSED_NOTE if self._frozen(sandbox_id) else None,
            )
        assert proc.stdout is not None and proc.stderr is not None
        capture = Capture(proc.stdout, proc.stderr, self._output_limit)
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
            await capture.settle(min(_DRAIN_GRACE_S, max(remaining, 0.05)))
        finally:
            if proc.returncode is None and not killed:
                await _kill(proc, _EXIT_GRACE_S)
            capture.cancel()
        return capture.result(
            # Still frozen: it exits with its SIGKILL when the sandbox thaws or stops.
            shell_exit_code(-signal.SIGKILL if proc.returncode is None else proc.returncode),
            started,
            timed_out=timed_out,
            note=_exec_note(paused, capture.out, capture.err),
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
        user: str | None = None,
        terminal_of: Callable[[], tuple[int, int]] | None = None,
    ) -> child.Child | guest.InitCommand:
        """A command started in this sandbox, in a process group of its own (so a signal to the group
        reaches everything the command starts): by its init through the guest channel when it offers
        one (see :meth:`_channel`), else by the launcher; on the terminal ``terminal_of`` opens (see
        :meth:`_terminal`), if given: opened once every check has passed, then closed by
        ``child.start`` whatever happens."""
        if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise InvalidSandbox("environment variable names and values must be strings", "env")
        record = self._live(sandbox_id)
        cgroup = _cgroup_of(record)
        if cgroup is not None and cgroup.frozen():
            raise SandboxPaused(f"sandbox {sandbox_id!r} is paused")
        hostname = record.spec.hostname or record.spec.id[:64]
        image = record.spec.image is not None
        user, inside, start_in = imageroot.command_user(record.spec, user)
        try:
            spec = launcher.encode(
                command, bwrap.sandbox_env(hostname, record.spec.env, env, user=user), cwd or start_in
            )
        except launcher.BadCommand as exc:
            raise InvalidSandbox(str(exc), exc.field) from None
        channel = self._channel(record, tty=terminal_of is not None)
        if channel is not None:
            try:
                return await channel.start(spec, stdin=stdin, user=inside if image else 0)
            except guest.ChannelLost as lost:
                if lost.sent:
                    # The init may have started it: never a second copy through the launcher.
                    raise RuntimeFailure(f"the sandbox's init was lost with the command: {lost}") from None
                # Not taken: the launcher then says what is wrong (the sandbox gone, no process to fork),
                # or runs it (an image's command server gone since: the next command starts another).
        # Only the init's identity, the sandbox user's ids and cgroup files on the command line; the
        # command, its environment and cwd travel on the descriptor.
        spec_fd = launcher.memfd("exec-spec", spec)
        init = record.init
        mode = "exec-root" if image else "exec"
        tty_flag = ["--tty"] if terminal_of is not None else []
        argv = [str(launcher.path()), mode, *tty_flag, str(init.pid), str(init.pid_ns)]
        argv.append(str(inside))
        argv += [
            str(inside),
            str(spec_fd),
            *(str(p) for p in (cgroup.procs_files if cgroup else [])),
        ]
        try:
            tty = terminal_of() if terminal_of is not None else None
            # Forked off the event loop (see corral.runtime.child): the loop goes on serving.
            return await child.start(
                argv, env=launcher.clean_env(), pass_fds=(spec_fd,), stdin=stdin, tty=tty
            )
        finally:
            os.close(spec_fd)

    def _channel(self, record: Running, *, tty: bool) -> guest.Channel | None:
        """The one place that chooses how a command enters a sandbox: this loop's connection to its
        guest channel (made now if need be), served by its init or, for an image's sandbox, by its
        command server (see :mod:`corral.runtime.commands`); or None for the launcher: a terminal's
        command (it needs the terminal's session set up by the launcher), a sandbox whose init offers
        no channel, an image's whose server does not serve yet (one is started for the commands
        after this one, which is never kept waiting for it: the launcher is no slower)."""
        if not self._guest_channel or tty:
            return None
        sandbox_id = record.spec.id
        loop = asyncio.get_running_loop()
        channel = self._channels.get(sandbox_id)
        if channel is not None and not channel.closed and channel.loop is loop:
            return channel
        if channel is not None and not channel.closed:
            # Another loop's connection: closed on its own loop, whose futures are its own to settle.
            with contextlib.suppress(RuntimeError):  # that loop is closed already: nothing waits on it
                channel.loop.call_soon_threadsafe(channel.close)
        channel = guest.Channel.connect(self.statedir.dir(sandbox_id))
        if channel is None and record.spec.image is not None:
            self._serve(sandbox_id, record.init, _cgroup_of(record))
        if channel is None:
            self._channels.pop(sandbox_id, None)
        else:
            self._channels[sandbox_id] = channel
        return channel

    def _serve(self, sandbox_id: str, init: procfs.ProcessIdentity, cgroup: SandboxCgroup | None) -> None:
        """Start an image sandbox's command server in the background (see
        :func:`corral.runtime.commands.start`), unless a start is under way on this loop already."""
        loop = asyncio.get_running_loop()
        pending = self._serving.get(sandbox_id)
        if pending is None or pending.done() or pending.get_loop() is not loop:
            directory = self.statedir.dir(sandbox_id)
            pending = asyncio.ensure_future(
                commands.start(directory, init, cgroup.procs_files if cgroup else [])
            )
            self._serving[sandbox_id] = pending

            def forget(done: asyncio.Future[str | None]) -> None:
                if self._serving.get(sandbox_id) is done:
                    del self._serving[sandbox_id]

            pending.add_done_callback(forget)

    async def _forget_channel(self, sandbox_id: str) -> None:
        """Before a teardown: this object's connection closed, and a command server's start under way
        waited for (its launcher holds the sandbox's namespaces open until it exits, soon either way:
        a teardown must find nothing of the sandbox left once it has killed the init)."""
        channel = self._channels.pop(sandbox_id, None)
        if channel is not None:
            channel.close()
        pending = self._serving.get(sandbox_id)
        if pending is not None and pending.get_loop() is asyncio.get_running_loop():
            await asyncio.wait({pending})  # its outcome is the start's own, not the teardown's

    async def spawn(
        self,
        sandbox_id: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bool = False,
        user: str | None = None,
        pty: PtySize | None = None,
    ) -> Spawned:
        cgroup = None
        held: list[int] = []  # the runtime's own descriptor of the terminal's master, once opened
        if pty is not None:
            try:
                terminal.check_size(pty)
            except ValueError as exc:
                raise InvalidSandbox(str(exc), "pty") from None
            cgroup = _cgroup_of(self._live(sandbox_id))  # whose processes a signal to its session reaches

        def open_terminal() -> tuple[int, int]:
            assert pty is not None
            control, pair = self._terminal(sandbox_id, pty, user)
            held.append(control)
            return pair

        try:
            proc = await self._run_in(
                sandbox_id,
                command,
                env,
                cwd,
                stdin=stdin,
                user=user,
                terminal_of=open_terminal if pty is not None else None,
            )
        except BaseException:
            for fd in held:
                os.close(fd)
            raise
        control = held[0] if held else None
        assert proc.stdout is not None and proc.stderr is not None

        exited = asyncio.ensure_future(proc.wait())

        async def wait() -> int:
            # asyncio's wait also waits for EOF on the pipes, which never comes while a reader holds
            # back (a full pipe left unread, see corral.agent.envd.processes): the exit is what is waited for.
            while not exited.done() and proc.returncode is None:
                await asyncio.wait({exited}, timeout=_EXIT_POLL_S)
            assert proc.returncode is not None
            return shell_exit_code(proc.returncode)

        def send(sig: int) -> None:
            if proc.returncode is not None:
                return
            if control is None:
                proc.signal(sig)
                return
            # On a terminal the command leads a session of its own; every process of that session
            # gets the signal (the launcher is alive, so the leader has not been reaped yet).
            session = terminal.session_of(control)
            if session is None:
                return
            with contextlib.suppress(ProcessLookupError, PermissionError, OSError):
                if cgroup is None:
                    os.killpg(session, sig)  # no cgroup to list: the leader's own group
                else:
                    terminal.signal_session(session, cgroup.pids(), sig)

        if control is None:
            return Spawned(proc.stdout, proc.stderr, proc.stdin, wait, send)
        master = control

        def resize(size: PtySize) -> None:
            if proc.returncode is None:
                terminal.resize(master, size)

        # Closed once, when the launcher has exited: resize and signal look at the exit first.
        exited.add_done_callback(lambda _: _close_quietly(master))
        return Spawned(proc.stdout, proc.stderr, proc.stdin, wait, send, resize)

    def _terminal(self, sandbox_id: str, size: PtySize, user: str | None) -> tuple[int, tuple[int, int]]:
        """A terminal of ``size`` in the sandbox's devpts, its slave owned by the host uid the
        command runs as: the runtime keeps one descriptor of its master (to resize it and find
        its session), the launcher gets the pair."""
        record = self._live(sandbox_id)
        try:
            master, slave = terminal.open_pair(record.init.pid, record.init.pid_ns, size)
        except OSError as exc:
            raise RuntimeFailure(f"sandbox {sandbox_id!r} has no terminal to give: {exc}") from None
        try:
            if record.uid is not None:
                image = record.spec.image is not None
                inside = (
                    imageroot.USERS.get(user or record.spec.user or bwrap.SANDBOX_USER, 0) if image else 0
                )
                os.fchown(slave, record.uid + inside, record.uid + inside)
            control = os.dup(master)
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        return control, (master, slave)

    # -- pause ----------------------------------------------------------------------------------

    async def guest_program(self, sandbox_id: str) -> str | None:
        """The launcher inside: the sandbox's init, a copy bubblewrap put where it runs it."""
        try:
            record = self._live(sandbox_id)
        except SandboxNotFound:
            return None
        path = bwrap.IMAGE_INIT_PATH if record.spec.image is not None else bwrap.INIT_PATH
        return await self._guest_fs.program(self, sandbox_id, path, record.init)

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

    async def reboot(self, sandbox_id: str) -> None:
        """End every process of the sandbox but its init (and bubblewrap's monitor above it), keeping
        its files (its root's writable layer, its home and /tmp: tmpfs mounts its init's namespace
        holds, still charged to its cgroup): what a boot from its disk would leave. Frozen while its
        processes are listed, so none forks meanwhile; left frozen or running as it was found."""
        record = self._live(sandbox_id)
        cgroup = _cgroup_of(record)
        if cgroup is None or not cgroup.can_freeze():
            raise RuntimeFailure(
                f"sandbox {sandbox_id!r} cannot be rebooted: this host has no cgroup freezer"
            )
        try:
            await asyncio.to_thread(_empty, cgroup, record.init.pid)
        except (CgroupError, OSError) as exc:
            raise RuntimeFailure(f"sandbox {sandbox_id!r} did not reboot: {exc}") from exc

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
        if not self._reclaimed:
            self._reclaimed = True
            await asyncio.to_thread(self._reclaim_disks)
        handles: list[SandboxHandle] = []
        for sandbox_id in self.statedir.ids():
            if sandbox_id in self._starting:
                continue
            record = self.statedir.load(sandbox_id)
            if isinstance(record, Running) and self._is_live(record):
                await self._roots.hold(record.spec.id, record.spec.image)
                handles.append(self._handle(record))
            elif isinstance(record, Running | Corrupt) or (
                isinstance(record, Starting) and not procfs.is_alive(record.starter)
            ):
                await self._forget_channel(sandbox_id)
                await asyncio.to_thread(self._teardown_record, sandbox_id, record)
        return handles

    def _reclaim_disks(self) -> int:
        """Remove the disks of sandboxes this root has no record of (see ImageRoots.reclaim), once: at
        the first list, which is an agent's adoption at start."""
        return self._roots.reclaim(
            lambda sandbox_id: sandbox_id in self._starting or self.statedir.dir(sandbox_id).exists(),
            lambda sandbox_id: rootfs.unmake(self._root_paths(sandbox_id)),
        )

    async def disk_used_mb(self, sandbox_id: str) -> int | None:
        """What the sandbox's writable layer holds on its disk; None when it has none (no image)."""
        record = self._live(sandbox_id)
        if record.spec.image is None:
            return None
        paths = self._root_paths(sandbox_id)
        try:
            return math.ceil(await asyncio.to_thread(rootfs.used_bytes, paths) / _MIB)
        except OSError:
            return None

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


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _opened(path: str, fds: list[int]) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    fds.append(fd)
    return fd


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


async def _kill(proc: child.Child | guest.InitCommand, grace_s: float) -> None:
    """SIGKILL the command's process group and wait up to ``grace_s`` for it to be reaped; past that
    it is reaped in the background whenever it exits."""
    proc.signal(signal.SIGKILL)
    waiting = asyncio.ensure_future(proc.wait())
    done, _pending = await asyncio.wait({waiting}, timeout=grace_s)
    if not done:
        _REAPING.add(waiting)
        waiting.add_done_callback(_REAPING.discard)


def _empty(cgroup: SandboxCgroup, init_pid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL every process of ``cgroup`` but ``init_pid`` and its ancestors in it, until they are gone."""
    was_frozen = cgroup.frozen()
    if not was_frozen:
        cgroup.freeze()
    spared, pid = set(), init_pid
    members = set(cgroup.pids())
    while pid in members:
        spared.add(pid)
        pid = procfs.parent(pid) or 0
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            left = [p for p in cgroup.pids() if p not in spared]
            if not left:
                return
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {cgroup.path} still holds {left} after SIGKILL")
            for p in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            cgroup.thaw()  # a frozen task acts on its SIGKILL only once thawed
            time.sleep(0.005)
    finally:
        if was_frozen:
            cgroup.freeze()
        else:
            cgroup.thaw()


_PAUSED_NOTE = (
    "the sandbox was paused while the command ran; it was killed at its timeout and ends "
    "when the sandbox is resumed or stopped"
)


def _exec_note(paused: bool, out: BoundedBuffer, err: BoundedBuffer) -> str | None:
    notes = [_PAUSED_NOTE] if paused else []
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
