"""The ``gvisor`` runtime: each sandbox is an OCI container run by ``runsc``, so a kernel of gVisor's
(the Sentry, in Go, in user space) stands between the tenant's system calls and the host's. The host
kernel sees only the Sentry and its gofer, under the Sentry's own seccomp filter.

A sandbox is made of:

* a bundle under the runtime's root (its config.json, an empty read-only rootfs the host's system
  directories are bound over read-only, its generated /etc files, a copy of corral's init and of the
  statx shim every program preloads, see ``statx_shim.c``), written by the runtime alone;
* the runsc container of that bundle, its pid 1 corral's init (which reaps orphans inside), started
  inside the sandbox's cgroups (memory, CPU, pids): the Sentry, its gofer and the platform's stub
  processes are all the sandbox's, so its memory is what the host gives the guest;
* no network (``--network=none``: loopback only), or, given a network slot, the slot's namespace
  as the container's (see :data:`NETWORK_MODES`): its interface, address and routes, behind the
  slot's host-side policy, exactly as a process sandbox's; its resolver in the generated
  resolv.conf;
* for a sandbox whose spec names an image: its root, the image's overlay over a disk of its
  ``disk_mb`` (the image mounted once per host, the disk from the pool: see
  :mod:`corral.runtime.imageroot`), mounted by host root under the sandbox's directory and handed to
  runsc as the container's writable root; the image's users run its commands, uids of gVisor's
  kernel that its gofer writes as they are on that disk.

A command on pipes is started, waited for and signalled through the Sentry's control socket (see
:mod:`corral.runtime.sentry`), with no host process of its own; a command on a terminal runs through
``runsc exec`` with its process spec on a descriptor, never on a command line, on a host pty that
runsc hands the Sentry (see :meth:`GvisorRuntime._spawn_on_terminal`). The platform is probed at start-up (``ptrace`` works
everywhere; ``systrap`` and ``kvm`` where the runsc release and the host allow). docs/isolation.md
compares its layers with the process runtime's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from corral.exec_result import ExecResult
from corral.images.resolver import ImageResolver
from corral.runtime import bwrap, child, imageroot, launcher, oci, rootfs, sentry, terminal
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
from corral.runtime.capture import DEFAULT_LIMIT, Capture
from corral.runtime.cgroups import CgroupError, CgroupRoot, SandboxCgroup, detect
from corral.runtime.guestfs import GuestFs
from corral.runtime.statedir import spec_from_dict, spec_to_dict, valid_id
from corral.runtime.stream import PtySize, Spawned, finished

DEFAULT_ROOT = Path("/run/corral/gvisor")
# The Sentry, its gofer and their Go runtimes take some tens of MiB before the guest runs anything.
MIN_MEMORY_MB = 64
# Probed best first. kvm is not probed: where /dev/kvm is not what runsc expects (a nested or
# paravirtual one) its sandbox spins instead of failing; an operator who knows it works names it.
PLATFORMS = ("systrap", "ptrace")
# How a sandbox in a network slot gets its network, in runsc's words. "host": the Sentry's sockets
# are the host kernel's, in the slot's namespace (and no other), so the slot's interface, address,
# routes and host-side policy are what the guest has. "sandbox": gVisor's own network stack over the
# slot's interface, the narrower boundary; runsc 20221219 refuses it on kernels where every network
# namespace has the sysctl its root-namespace check reads (this one: "cannot run with network
# enabled in root network namespace"), so it is for a newer runsc, named by the operator.
NETWORK_MODES = ("host", "sandbox")
_MIB = 1024 * 1024
_RUNSC_TIMEOUT_S = 30.0
_PROBE_TIMEOUT_S = 10.0
_EXIT_GRACE_S = 1.0
_DRAIN_GRACE_S = 0.5
_STATE = "sandbox.json"
# An image sandbox's digest, written before its image is mounted (a teardown unmounts an image that
# no sandbox directory names, started or starting) and read back by its teardown.
_IMAGE = "image-digest"
# A command the Sentry would not start (no such program, a bad directory), as a shell reports one.
_NOT_STARTED = 127
_ERROR_BYTES = 64 * 1024


def runsc_path() -> str | None:
    return shutil.which("runsc")


@functools.cache
def probe_platform(runsc: str | None = None) -> str | None:
    """The best platform this host's runsc runs a container on, or None (no runsc, or none works)."""
    runsc = runsc or runsc_path()
    if runsc is None:
        return None
    for platform in PLATFORMS:
        if _runs(runsc, platform):
            return platform
    return None


def _runs(runsc: str, platform: str) -> bool:
    with tempfile.TemporaryDirectory(prefix="corral-gvisor-probe-") as work:
        bundle = Path(work) / "bundle"
        (bundle / "rootfs").mkdir(parents=True)
        config = {
            "ociVersion": oci.OCI_VERSION,
            "process": oci.process(["/bin/true"], {"PATH": bwrap.DEFAULT_PATH}, "/", uid=0),
            "root": {"path": "rootfs", "readonly": True},
            "mounts": [oci._bind(p, p) for p in bwrap.SYSTEM_PATHS if Path(p).exists()],
            "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]},
        }
        (bundle / "config.json").write_text(json.dumps(config))
        argv = [
            runsc,
            "--root",
            f"{work}/state",
            f"--platform={platform}",
            "--network=none",
            "--ignore-cgroups",
        ]
        # Container ids name abstract sockets, machine-wide: the probe's is its own.
        name = f"corral-probe-{os.getpid()}-{os.urandom(4).hex()}"
        proc = subprocess.Popen(
            [*argv, "run", "--bundle", str(bundle), name],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=launcher.clean_env(),
            start_new_session=True,
        )
        try:
            return proc.wait(_PROBE_TIMEOUT_S) == 0
        except subprocess.TimeoutExpired:
            return False
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for args in (("kill", "--all", name, "KILL"), ("delete", "--force", name)):
                subprocess.run(
                    [*argv, *args], capture_output=True, timeout=_RUNSC_TIMEOUT_S, env=launcher.clean_env()
                )


def unavailable_reason() -> str | None:
    if runsc_path() is None:
        return "runsc (gVisor) is not installed: `make system-deps` installs it"
    if os.geteuid() != 0:
        return "the gvisor runtime runs containers as root"
    if probe_platform() is None:
        return "runsc runs no container on this host on any platform (" + ", ".join(PLATFORMS) + ")"
    return None


class GvisorRuntime:
    """Sandboxes behind gVisor's kernel on this host. See the module docstring."""

    name = "gvisor"
    # The Sentry maps guest memory lazily and its own Go heap grows at first: readings settle later.
    memory_settle_s = 1.0

    @staticmethod
    def available() -> bool:
        return unavailable_reason() is None

    def __init__(
        self,
        root: Path | None = None,
        *,
        cgroup_root: CgroupRoot | Literal["auto"] | None = "auto",
        output_limit_bytes: int = DEFAULT_LIMIT,
        system_paths: Sequence[str] = bwrap.SYSTEM_PATHS,
        platform: str | None = None,
        cgroup_prefix: str = "",
        network_mode: str = "host",
        images: ImageResolver | None = None,
        disk_root: Path | None = None,
        disk_pool_depth: int = rootfs.DEFAULT_POOL_DEPTH,
    ) -> None:
        if network_mode not in NETWORK_MODES:
            raise ValueError(f"network_mode must be one of {NETWORK_MODES}, got {network_mode!r}")
        self.network_mode = network_mode
        self.root = root or DEFAULT_ROOT
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.cgroups: CgroupRoot | None = detect() if cgroup_root == "auto" else cgroup_root
        self._cgroup_tag = cgroup_prefix
        self._output_limit = output_limit_bytes
        self._system_paths = tuple(p for p in system_paths if Path(p).exists())
        runsc = runsc_path()
        if runsc is None:
            raise RuntimeFailure("runsc (gVisor) is not installed")
        self._runsc = runsc
        chosen = platform or probe_platform(runsc)
        if chosen is None:
            raise RuntimeFailure(unavailable_reason() or "runsc runs no container here")
        self.platform = chosen
        self._guest_fs = GuestFs()
        self._paused: set[str] = set()
        # The host's ``runsc exec`` of every terminal's command still running, by sandbox: one blocked
        # on a terminal nobody reads would outlive its container, so a stop kills them.
        self._execs: dict[str, set[asyncio.subprocess.Process]] = {}
        key = hashlib.sha256(str(self.root.resolve()).encode()).hexdigest()
        self._tag = "c" + key[:10] + "-"
        # Image sandboxes' roots: the images mounted under this root (0700, host root's), the disks in
        # a directory of this root's own, as the process runtime keeps them.
        self._roots = imageroot.ImageRoots(
            images, self.root, disk_root or imageroot.DEFAULT_DISK_ROOT / f"gv-{key[:16]}", disk_pool_depth
        )
        self._reclaimed = False

    # -- paths and runsc ------------------------------------------------------------------------

    def _dir(self, sandbox_id: str) -> Path:
        if not valid_id(sandbox_id):
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        return self.root / "sandboxes" / sandbox_id

    def _cid(self, sandbox_id: str) -> str:
        """The container's id: runsc names abstract sockets after it, machine-wide, and two hosts on
        one machine may run one sandbox id (an old copy and its recreation): each root has its own."""
        return self._tag + sandbox_id

    def _control(self, sandbox_id: str) -> sentry.Control:
        return sentry.Control(self._cid(sandbox_id), self.root / "runsc")

    def _argv(self, *args: str, in_cgroups: bool = False, network: str = "none") -> list[str]:
        """runsc's command line. ``in_cgroups`` (a create inside the sandbox's cgroups): runsc reads
        them (the bundle names them, see :func:`oci.bundle_config`), which is how the Sentry learns
        the guest's memory size; every other command ignores them, so that none of runsc's own
        processes (an exec, a kill) is ever moved into a sandbox's cgroups or counted there.
        ``network``: a create's and its start's network (see :data:`NETWORK_MODES`); other commands
        ignore it."""
        return [
            self._runsc,
            "--root",
            str(self.root / "runsc"),
            f"--platform={self.platform}",
            f"--network={network}",
            *(() if in_cgroups else ("--ignore-cgroups",)),
            *args,
        ]

    async def _runsc_ok(self, *args: str, timeout_s: float = _RUNSC_TIMEOUT_S, network: str = "none") -> str:
        proc = await asyncio.create_subprocess_exec(
            *self._argv(*args, network=network),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=launcher.clean_env(),
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise RuntimeFailure(f"runsc {args[0]} took longer than {timeout_s:g}s") from None
        if proc.returncode != 0:
            raise RuntimeFailure(f"runsc {args[0]} failed: {err.decode(errors='replace').strip()[-2000:]}")
        return out.decode(errors="replace")

    def _cgroup(self, sandbox_id: str) -> SandboxCgroup | None:
        return self.cgroups.child(self._cgroup_tag + "gv-" + sandbox_id) if self.cgroups else None

    # -- start and stop -------------------------------------------------------------------------

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        self._validate(spec)
        home = self._dir(spec.id)
        try:
            home.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            home.mkdir(mode=0o700)
        except FileExistsError:
            raise SandboxExists(f"sandbox {spec.id!r} already exists") from None
        cgroup = self._cgroup(spec.id)
        created = False
        try:
            if cgroup is not None:
                cgroup.create(spec.memory_mb, cpus=spec.cpus, pids=spec.pids)
                created = True
            if spec.image is not None:
                await self._make_root(home, spec)
            bundle = await asyncio.to_thread(self._write_bundle, home, spec)
            network = self.network_mode if spec.netns else "none"
            await self._create_in(cgroup, bundle, spec.id, network)
            await self._runsc_ok("start", self._cid(spec.id), network=network)  # as it was created
        except BaseException as exc:
            await asyncio.shield(asyncio.to_thread(self._teardown, spec.id, cgroup if created else None))
            if isinstance(exc, RuntimeFailure | CgroupError | OSError | rootfs.RootfsError):
                raise RuntimeFailure(f"sandbox {spec.id!r} did not start: {exc}") from exc
            raise
        started = time.time()
        (home / _STATE).write_text(json.dumps({"spec": spec_to_dict(spec), "started_at": started}))
        return SandboxHandle(spec.id, spec, started, ref=str(home))

    def _validate(self, spec: SandboxSpec) -> None:
        if not valid_id(spec.id):
            raise InvalidSandbox(f"sandbox id {spec.id!r} is invalid", "id")
        if spec.memory_mb < MIN_MEMORY_MB:
            raise InvalidSandbox(
                f"memory_mb: a gvisor sandbox needs at least {MIN_MEMORY_MB} MiB, got {spec.memory_mb}",
                "memory_mb",
            )
        imageroot.refuse_without_image(spec)
        if spec.image is not None:
            imageroot.validate(spec)
            self._roots.require(os.geteuid() == 0)

    # -- an image sandbox's root ------------------------------------------------------------------

    def _root_paths(self, sandbox_id: str) -> rootfs.RootPaths:
        """Its overlay under its own directory (0700 under a 0700 root, both host root's): only host
        root and runsc's gofer reach it."""
        home = self._dir(sandbox_id)
        return rootfs.RootPaths(home, home / "overlay", rootfs.disk_path(self._roots.disk_root, sandbox_id))

    async def _make_root(self, home: Path, spec: SandboxSpec) -> None:
        """The image held and mounted, the disk taken, the overlay mounted, and the places the bundle
        mounts onto made real directories and files in it (an image's link there is replaced)."""
        assert spec.image is not None
        (home / _IMAGE).write_text(spec.image)
        paths = self._root_paths(spec.id)
        paths.entry.mkdir(mode=0o700)
        image_mnt = await self._roots.take(spec, paths.disk_dir)
        await asyncio.to_thread(rootfs.make_unmapped, paths, image_mnt=image_mnt)
        files = (*bwrap.IMAGE_MOUNT_FILES, *(("etc/resolv.conf",) if self._resolv_conf(spec) else ()))
        await asyncio.to_thread(
            rootfs.prepare_mountpoints, paths.merged, (*bwrap.IMAGE_MOUNT_DIRS, "sys"), files, 0
        )

    @staticmethod
    def _resolv_conf(spec: SandboxSpec) -> bytes | None:
        """An image sandbox's resolv.conf as the process runtime gives it: its slot's resolver, else
        the host's when it has the network, else the image's own."""
        if spec.nameserver is not None:
            return bwrap.resolv_conf(spec.nameserver)
        if spec.network and Path("/etc/resolv.conf").exists():
            return Path("/etc/resolv.conf").read_bytes()
        return None

    async def fill_disks(self, disk_mb: int = rootfs.DEFAULT_DISK_MB) -> int:
        """Make the pool's disks of ``disk_mb`` ahead (a warm-start optimisation: never required)."""
        return await self._roots.fill(disk_mb)

    async def drain_disks(self) -> None:
        """Unmount and remove the pool's ready disks (at shutdown; a later start makes them again)."""
        await self._roots.drain()

    def _image_in_use(self, digest: str) -> bool:
        return any(_image_of(home) == digest for home in (self.root / "sandboxes").glob("*"))

    def _write_bundle(self, home: Path, spec: SandboxSpec) -> Path:
        if spec.image is not None:
            return self._write_image_bundle(home, spec)
        bundle = home / "bundle"
        rootfs = bundle / "rootfs"
        rootfs.mkdir(parents=True)
        # Mount points, so the read-only root lists as a root does (gVisor makes none of its own).
        for point in (
            *self._system_paths,
            "/etc",
            "/proc",
            "/dev",
            "/sys",
            "/tmp",
            bwrap.SANDBOX_HOME,
            "/.corral",
        ):
            (rootfs / point.lstrip("/")).mkdir(parents=True, exist_ok=True)
        (rootfs / bwrap.INIT_PATH.lstrip("/")).touch()
        (rootfs / oci.preload_path(image=False).lstrip("/")).touch()
        etc_data = bwrap.etc_files(spec.hostname or spec.id[:63])
        etc_data["ld.so.preload"] = oci.preload_list(image=False)
        if (resolv := self._resolv_conf(spec)) is not None:
            etc_data["resolv.conf"] = resolv
        for name in etc_data:
            (rootfs / "etc" / name).touch()
        for name in bwrap.HOST_ETC:
            on_host, mount_at = Path("/etc") / name, rootfs / "etc" / name
            if on_host.is_dir():
                mount_at.mkdir()
            elif on_host.exists():
                mount_at.touch()
        etc = home / "etc"
        etc.mkdir()
        etc_sources: dict[str, str] = {}
        for name, data in etc_data.items():
            (etc / name).write_bytes(data)
            etc_sources[name] = str(etc / name)
        for name in bwrap.HOST_ETC:
            if (Path("/etc") / name).exists():
                etc_sources.setdefault(name, f"/etc/{name}")
        return self._write_config(bundle, home, spec, etc_sources)

    def _write_image_bundle(self, home: Path, spec: SandboxSpec) -> Path:
        """An image sandbox's bundle: its overlay as the root, the /etc files the process runtime
        writes over an image's (its hosts; its resolv.conf when it has a resolver to name)."""
        bundle = home / "bundle"
        bundle.mkdir()
        etc = home / "etc"
        etc.mkdir()
        files = bwrap.image_etc_files(spec.hostname or spec.id[:63])
        files["ld.so.preload"] = oci.preload_list(image=True)
        if (resolv := self._resolv_conf(spec)) is not None:
            files["resolv.conf"] = resolv
        etc_sources: dict[str, str] = {}
        for name, data in files.items():
            (etc / name).write_bytes(data)
            etc_sources[name] = str(etc / name)
        return self._write_config(bundle, home, spec, etc_sources)

    def _write_config(self, bundle: Path, home: Path, spec: SandboxSpec, etc_sources: dict[str, str]) -> Path:
        hostname = spec.hostname or spec.id[:63]
        init = home / "init"
        init.write_bytes(launcher.binary())
        init.chmod(0o555)
        shim = home / "statx.so"  # readable by the guest's users, as the cache's copy is not
        shutil.copyfile(launcher.statx_shim(), shim)
        shim.chmod(0o444)
        image = spec.image is not None
        user = imageroot.command_user(spec, None)[0]
        config = oci.bundle_config(
            hostname=hostname,
            env=bwrap.sandbox_env(hostname, spec.env, user=user),
            system_paths=self._system_paths,
            etc_files=etc_sources,
            init_source=str(init),
            tmpfs_bytes=spec.memory_mb * _MIB,
            in_own_cgroups=self._cgroup(spec.id) is not None,
            netns=spec.netns,
            image_root=str(self._root_paths(spec.id).merged) if image else None,
            preload_source=str(shim),
        )
        (bundle / "config.json").write_text(json.dumps(config))
        return bundle

    async def _create_in(
        self, cgroup: SandboxCgroup | None, bundle: Path, sandbox_id: str, network: str
    ) -> None:
        """``runsc create``, itself (and so the Sentry and gofer it forks) inside the sandbox's cgroups
        before it runs: nothing of the sandbox is ever outside its limits."""
        procs = [str(p) for p in cgroup.procs_files] if cgroup is not None else []

        def join() -> None:
            for path in procs:
                with open(path, "w") as f:
                    f.write("0")

        def run() -> tuple[int, bytes]:
            # The Sentry inherits runsc's descriptors and keeps them: wait for runsc itself, not for
            # the end of its stderr, then take what it said and close our end (the sandbox's copy
            # then writes to a closed pipe: nothing of the sandbox reaches a host file).
            proc = subprocess.Popen(
                self._argv(
                    "create",
                    "--bundle",
                    str(bundle),
                    self._cid(sandbox_id),
                    in_cgroups=bool(procs),
                    network=network,
                ),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                preexec_fn=join,
                env=launcher.clean_env(),
                cwd="/",
            )
            assert proc.stderr is not None
            try:
                code = proc.wait(_RUNSC_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
            os.set_blocking(proc.stderr.fileno(), False)
            try:
                said = proc.stderr.read(_ERROR_BYTES) or b""
            except BlockingIOError:
                said = b""
            proc.stderr.close()
            return code, said

        code, said = await asyncio.to_thread(run)
        if code != 0:
            raise RuntimeFailure(f"runsc create failed: {said.decode(errors='replace').strip()[-2000:]}")

    async def stop(self, sandbox_id: str) -> None:
        home = self._dir(sandbox_id)
        if not home.exists():
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}")
        await asyncio.to_thread(self._teardown, sandbox_id, self._cgroup(sandbox_id))

    def _teardown(self, sandbox_id: str, cgroup: SandboxCgroup | None) -> None:
        """Everything the sandbox was, gone: the container (thawed first, or it could not die), its
        cgroups with whatever is left in them, its bundle."""
        self._paused.discard(sandbox_id)
        for proc in list(self._execs.pop(sandbox_id, ())):
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
        env = launcher.clean_env()
        cid = self._cid(sandbox_id)
        for args in (("resume", cid), ("kill", "--all", cid, "KILL"), ("delete", "--force", cid)):
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                subprocess.run(self._argv(*args), capture_output=True, timeout=_RUNSC_TIMEOUT_S, env=env)
        if cgroup is not None and cgroup.exists():
            with contextlib.suppress(CgroupError, OSError):
                cgroup.kill()
            with contextlib.suppress(CgroupError, OSError):
                cgroup.remove()
        home = self.root / "sandboxes" / sandbox_id
        image = _image_of(home)
        if image is not None:
            # Its overlay and disk first: the directory goes only once nothing is mounted in it.
            rootfs.unmake(self._root_paths(sandbox_id))
            self._roots.release(sandbox_id, image)
        if not rootfs.mounted(self._root_paths(sandbox_id).merged):
            shutil.rmtree(home, ignore_errors=True)
        if image is not None:
            self._roots.unmount_unless(image, lambda: self._image_in_use(image))

    # -- commands -------------------------------------------------------------------------------

    def _command(
        self,
        sandbox_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        user: str | None = None,
    ) -> tuple[Sequence[str], dict[str, str], str, int, bool]:
        """The command checked as the process runtime checks it, with the sandbox's environment, as
        ``user`` (or the spec's: see :func:`imageroot.command_user`): its argv, env, cwd, uid inside
        and whether its sandbox runs an image."""
        if sandbox_id in self._paused:
            raise SandboxPaused(f"sandbox {sandbox_id!r} is paused")
        spec = spec_from_dict(self._live_state(sandbox_id)["spec"])
        name, uid, start_in = imageroot.command_user(spec, user)
        try:
            launcher.check_command(command, dict(env or {}), cwd or start_in)
        except launcher.BadCommand as exc:
            raise InvalidSandbox(str(exc), exc.field) from None
        hostname = spec.hostname or spec.id[:63]
        full_env = bwrap.sandbox_env(hostname, spec.env, env, user=name)
        return command, full_env, cwd or start_in, uid, spec.image is not None

    async def _start(
        self,
        sandbox_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        *,
        stdin: bool,
        user: str | None = None,
    ) -> sentry.SentryCommand | Spawned:
        """A command on pipes, started by the Sentry (see :mod:`corral.runtime.sentry`); one the
        Sentry refused (no such program) as it ended, its reason on stderr."""
        argv, full_env, where, uid, _image = self._command(sandbox_id, command, env, cwd, user)
        cid = self._cid(sandbox_id)
        # Each user's gid is its uid (the sandbox user's 1000, root's 0).
        args = sentry.exec_args(cid, argv, full_env, where, uid=uid, gid=uid)
        try:
            return await sentry.start(self._control(sandbox_id), args, stdin=stdin)
        except sentry.SentryRefused as exc:
            return finished(_NOT_STARTED, stderr=f"corral: {exc}\n".encode())
        except sentry.SentryGone as exc:
            if sandbox_id not in await self._running():  # its Sentry died: the sandbox has ended
                raise SandboxNotFound(f"sandbox {sandbox_id!r} has stopped") from None
            raise RuntimeFailure(f"sandbox {sandbox_id!r} runs no command: {exc}") from None

    async def _open_on_terminal(
        self,
        sandbox_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        tty: int,
        user: str | None,
    ) -> tuple[asyncio.subprocess.Process, Path]:
        """``runsc exec`` of a command on a terminal's slave ``tty``, which becomes runsc's controlling
        one (``setsid --ctty``): what the terminal signals (typed ^C, a resize's SIGWINCH) reaches
        runsc, which forwards every signal to the command inside."""
        argv, full_env, where, uid, image = self._command(sandbox_id, command, env, cwd, user)
        process = oci.process(argv, full_env, where, uid=uid, terminal=True, no_new_privileges=not image)
        fd = launcher.memfd("process", json.dumps(process).encode())
        pid_file = self._dir(sandbox_id) / f"exec-{os.urandom(6).hex()}.pid"
        try:
            proc = await asyncio.create_subprocess_exec(
                "setsid",  # not a session's leader yet, so setsid needs no fork
                "--ctty",
                *self._argv(
                    "exec",
                    "--process",
                    f"/proc/self/fd/{fd}",
                    "--internal-pid-file",
                    str(pid_file),
                    self._cid(sandbox_id),
                ),
                stdin=tty,
                stdout=tty,
                stderr=tty,
                pass_fds=(fd,),
                env=launcher.clean_env(),
                cwd="/",
            )
        finally:
            os.close(fd)
        self._execs.setdefault(sandbox_id, set()).add(proc)
        return proc, pid_file

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
        command_ = await self._start(sandbox_id, command, env, cwd, stdin=False)
        capture = Capture(command_.stdout, command_.stderr, self._output_limit)
        timed_out = False
        try:
            try:
                code = await asyncio.wait_for(command_.wait(), timeout_s)
            except TimeoutError:
                timed_out = True
                command_.signal(signal.SIGKILL)
                code = 128 + signal.SIGKILL
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(command_.wait(), _EXIT_GRACE_S)
            await capture.settle(_DRAIN_GRACE_S)
        finally:
            capture.cancel()
        return capture.result(code, started, timed_out=timed_out)

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
        if pty is not None:
            return await self._spawn_on_terminal(sandbox_id, command, env, cwd, stdin, pty, user)
        started = await self._start(sandbox_id, command, env, cwd, stdin=stdin, user=user)
        if isinstance(started, Spawned):
            return started
        return Spawned(started.stdout, started.stderr, started.stdin, started.wait, started.signal)

    async def _spawn_on_terminal(
        self,
        sandbox_id: str,
        command: Sequence[str],
        env: Mapping[str, str] | None,
        cwd: str | None,
        stdin: bool,
        size: PtySize,
        user: str | None,
    ) -> Spawned:
        """A command on a host terminal the Sentry is handed (runsc's ``terminal``): the guest sees a
        terminal of gVisor's host-file kind, not one of its own devpts (``tty`` says "not a tty"
        there), but sizes, line discipline, job control and signals behave as on any terminal."""
        try:
            terminal.check_size(size)
        except ValueError as exc:
            raise InvalidSandbox(str(exc), "pty") from None
        master, slave = os.openpty()
        try:
            terminal.resize(master, size)
            control = os.dup(master)
        except BaseException:
            os.close(master)
            os.close(slave)
            raise
        try:
            proc, pid_file = await self._open_on_terminal(sandbox_id, command, env, cwd, slave, user)
        except BaseException:
            os.close(master)
            os.close(control)
            raise
        finally:
            os.close(slave)
        loop = asyncio.get_running_loop()
        writer = child.writer(loop, os.dup(master)) if stdin else None
        exited = asyncio.ensure_future(proc.wait())
        # Closed once, when runsc has exited: resize looks at the exit first.
        exited.add_done_callback(lambda _: os.close(control))

        def resize(new: PtySize) -> None:
            if proc.returncode is None:
                terminal.resize(control, new)

        async def wait() -> int:
            try:
                return shell_exit_code(await proc.wait())
            finally:
                self._execs.get(sandbox_id, set()).discard(proc)
                pid_file.unlink(missing_ok=True)

        def send(sig: int) -> None:
            with contextlib.suppress(OSError, ValueError):
                if proc.returncode is None:
                    sentry.signal_soon(self._control(sandbox_id), int(pid_file.read_text()), sig)

        return Spawned(child.reader(loop, master), child.ended(), writer, wait, send, resize)

    # -- pause, measure, list -------------------------------------------------------------------

    async def pause(self, sandbox_id: str) -> None:
        self._state(sandbox_id)
        await self._runsc_ok("pause", self._cid(sandbox_id))
        self._paused.add(sandbox_id)

    async def resume(self, sandbox_id: str) -> None:
        self._state(sandbox_id)
        await self._runsc_ok("resume", self._cid(sandbox_id))
        self._paused.discard(sandbox_id)

    async def guest_program(self, sandbox_id: str) -> str | None:
        """The launcher inside: the bundle's copy, the container's init."""
        try:
            started = self._state(sandbox_id).get("started_at")
        except SandboxNotFound:
            return None
        image = self._state(sandbox_id)["spec"].get("image") is not None
        path = bwrap.IMAGE_INIT_PATH if image else bwrap.INIT_PATH
        return await self._guest_fs.program(self, sandbox_id, path, started)

    def paused(self, sandbox_id: str) -> bool:
        self._state(sandbox_id)
        return sandbox_id in self._paused

    async def resident_mb(self, sandbox_id: str) -> int | None:
        self._live_state(sandbox_id)
        cgroup = self._cgroup(sandbox_id)
        if cgroup is None or not cgroup.exists():
            if sandbox_id not in await self._running():
                raise SandboxNotFound(f"sandbox {sandbox_id!r} has stopped")
            return None
        return -(-cgroup.working_set_bytes() // _MIB)

    async def disk_used_mb(self, sandbox_id: str) -> int | None:
        """What the sandbox's writable layer holds on its disk; None when it has none (no image)."""
        if spec_from_dict(self._live_state(sandbox_id)["spec"]).image is None:
            return None
        try:
            return -(-(await asyncio.to_thread(rootfs.used_bytes, self._root_paths(sandbox_id))) // _MIB)
        except OSError:
            return None

    async def oom_kills(self, sandbox_id: str) -> int:
        """The sandbox cgroup's count, read until the sandbox is torn down: when the OOM killer's choice
        was the Sentry itself (the cgroup's largest process), the sandbox has ended by the time its
        command's exit is read, and that kill is the one its command's result must name."""
        self._state(sandbox_id)
        cgroup = self._cgroup(sandbox_id)
        return cgroup.oom_kills() if cgroup is not None and cgroup.exists() else 0

    def _live_state(self, sandbox_id: str) -> dict[str, Any]:
        """The record of a sandbox that still runs. Its init may die (a tenant can kill its pid 1 from
        inside gVisor) or its Sentry be killed: the whole container ends with it, and its cgroup,
        where the Sentry, gofer and stubs all ran, is left empty. Such a sandbox is not found, so
        that its agent reports it stopped and tears down what is left."""
        state = self._state(sandbox_id)
        cgroup = self._cgroup(sandbox_id)
        if cgroup is not None and cgroup.exists() and not cgroup.pids():
            raise SandboxNotFound(f"sandbox {sandbox_id!r} has stopped")
        return state

    def host_pids(self, sandbox_id: str) -> list[int]:
        """Every host process runsc runs for the sandbox: its Sentry, gofer and the platform's stubs,
        all started inside its cgroup (none without cgroups)."""
        self._state(sandbox_id)
        cgroup = self._cgroup(sandbox_id)
        return cgroup.pids() if cgroup is not None else []

    def _state(self, sandbox_id: str) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads((self._dir(sandbox_id) / _STATE).read_text())
        except (OSError, ValueError):
            raise SandboxNotFound(f"no sandbox {sandbox_id!r}") from None
        return data

    async def list(self) -> list[SandboxHandle]:
        found: list[SandboxHandle] = []
        base = self.root / "sandboxes"
        if not self._reclaimed:
            # Once, at an agent's adoption: the disks of sandboxes this root has no directory of.
            self._reclaimed = True
            await asyncio.to_thread(
                self._roots.reclaim,
                lambda sandbox_id: (base / sandbox_id).exists(),
                lambda sandbox_id: rootfs.unmake(self._root_paths(sandbox_id)),
            )
        if not base.exists():
            return found
        # The records first, then what runs: a record is written once its container has started, so
        # one read before runsc's listing is in that listing unless its container has ended since.
        records: list[tuple[Path, dict[str, Any]]] = []
        for home in sorted(base.iterdir()):
            try:
                records.append((home, json.loads((home / _STATE).read_text())))
            except (OSError, ValueError):
                continue  # a start under way (or what a crash left: the disk reclaim's)
        running = await self._running()
        for home, state in records:
            if home.name not in running:
                # Its container is gone (its Sentry or init died, the host rebooted): what is left of
                # it (bundle, cgroups, an image's overlay and disk) goes now, as the process
                # runtime's listing does; nothing else would ever ask for this id again.
                await asyncio.to_thread(self._teardown, home.name, self._cgroup(home.name))
                continue
            spec = spec_from_dict(state["spec"])
            await self._roots.hold(spec.id, spec.image)
            found.append(SandboxHandle(spec.id, spec, float(state["started_at"]), ref=str(home)))
        return found

    async def _running(self) -> set[str]:
        try:
            out = await self._runsc_ok("list", "--format=json")
        except RuntimeFailure:
            return set()
        try:
            listed = json.loads(out) or []
        except ValueError:
            return set()
        tag = self._cid("")
        return {
            c["id"][len(tag) :]
            for c in listed
            if c.get("status") in ("running", "paused") and c["id"].startswith(tag)
        }


def _image_of(home: Path) -> str | None:
    """The digest an image sandbox's directory names, or None (not an image's, or gone)."""
    try:
        return (home / _IMAGE).read_text() or None
    except OSError:
        return None
