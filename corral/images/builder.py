"""The builder: a recipe's steps run one by one, each in a build sandbox over the layers before it,
each result a cached layer keyed by (parent, step); the top layer packed into one erofs image and put
in the blob store. Also the importer's tail: an unpacked archive gets the same fix-ups and packing.

A step runs as root of the build's user namespace (an unprivileged host uid range), with its own pid,
ipc, uts and network namespaces (the network is shared only when the build's limits allow it), the
overlay of its parent layers as its root and an upper on a loop disk of the build's disk limit; the
build has a deadline, its output goes to a log line by line, and a failing step is reported with its
line and the last of its output.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shlex
import shutil
import stat
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from corral.images import importer, registry
from corral.images.bases import Bases, canonical
from corral.images.blobs import BlobStore
from corral.images.config import ImageConfig
from corral.images.digest import digest_file
from corral.images.helper import JobTimedOut, Log, run_job
from corral.images.importer import ImportRefused
from corral.images.jail import BUILD_UID_BASE, HELPER_FAILED
from corral.images.layers import LayerCache, LayerInfo, layer_key
from corral.images.recipe import Recipe, Step

# How a registry image is fetched: its reference, where its OCI archive goes, the time left.
Pull = Callable[[str, Path, float], Awaitable[Path]]

# The version of the fix-ups every image root gets (see jail.fixups): part of a base layer's key.
FIXUPS = "fixups-v1"
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CONTEXT_MOUNT = "/.corral-context"
CA_MOUNT = "/dev/corral-ca.crt"
CA_VARIABLES = ("SSL_CERT_FILE", "PIP_CERT", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS")


@dataclass(frozen=True, slots=True)
class BuildLimits:
    timeout_s: float = 900.0
    disk_mb: int = 4096  # the most one step may write (its upper's disk) and an archive may unpack to
    network: bool = False  # whether steps share the host's network (apt, pip); off unless asked
    # With the network: a CA bundle of the host's that steps' TLS clients trust (bound read-only at
    # CA_MOUNT, on the sandbox's own /dev, so it is in no layer; named by the usual variables).
    ca_file: str | None = None


class BuildFailed(Exception):
    """A build stopped: ``reason`` is ``failed`` (a step's command exited non-zero), ``timeout``,
    ``refused`` (an archive or base the builder does not take) or ``builder`` (the builder itself)."""

    def __init__(self, reason: str, message: str, *, line: int = 0, step: str = "", output: str = "") -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.line = line
        self.step = step
        self.output = output

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "message": self.message,
            "line": self.line,
            "step": self.step,
            "output": self.output,
        }


@dataclass(frozen=True, slots=True)
class Layers:
    """A recipe's steps done: the top layer, the image's config, what ran and what was cached."""

    top: str
    config: ImageConfig
    steps_run: int
    steps_cached: int


@dataclass(frozen=True, slots=True)
class Built:
    digest: str
    config: ImageConfig
    size_bytes: int
    top_layer: str
    steps_run: int
    steps_cached: int


@dataclass
class _Run:
    deadline: float
    log: Log
    limits: BuildLimits
    ran: int = 0
    cached: int = 0
    clock: Callable[[], float] = field(default=time.monotonic)

    def remaining(self) -> float:
        left = self.deadline - self.clock()
        if left <= 0:
            raise BuildFailed("timeout", "the build ran past its time limit")
        return left


def _noop(_: str) -> None:
    return None


def context_digest(root: Path, sources: tuple[str, ...]) -> str:
    """What a COPY copies, hashed: names, modes, symlink targets and bytes (no link is followed)."""
    h = hashlib.sha256()
    for source in sources:
        top = root / source
        paths = [top]
        if top.is_dir() and not top.is_symlink():
            paths += sorted(top.rglob("*"))
        for path in paths:
            try:
                st = path.lstat()
            except FileNotFoundError:
                h.update(f"missing:{path.relative_to(root)}\0".encode())
                continue
            h.update(f"{path.relative_to(root)}\0{st.st_mode:o}\0".encode())
            if stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
            elif stat.S_ISREG(st.st_mode):
                with path.open("rb") as f:
                    while chunk := f.read(1 << 20):
                        h.update(chunk)
            h.update(b"\0")
    return h.hexdigest()


def _copy_script(step: Step) -> str:
    """The shell a COPY runs inside its sandbox: Docker's rules (a directory's contents, a file into
    a directory when the destination ends in /), owned by root or ``--chown``'s owner."""
    lines = ["set -e"]
    for source in step.sources:
        src = shlex.quote(f"{CONTEXT_MOUNT}/{source}")
        if step.dest.endswith("/") or len(step.sources) > 1:
            dest_dir = step.dest.rstrip("/") or "/"
            target = shlex.quote(f"{dest_dir}/{os.path.basename(source)}")
            lines.append(
                f"if [ -d {src} ]; then mkdir -p {shlex.quote(dest_dir)}; cp -a --no-preserve=ownership {src}/. {shlex.quote(dest_dir)}/;"
                f" else mkdir -p {shlex.quote(dest_dir)}; cp -a --no-preserve=ownership {src} {target}; fi"
            )
            owned = shlex.quote(dest_dir)
        else:
            dest = shlex.quote(step.dest)
            lines.append(
                f"if [ -d {src} ]; then mkdir -p {dest}; cp -a --no-preserve=ownership {src}/. {dest}/;"
                f' else mkdir -p "$(dirname {dest})"; cp -a --no-preserve=ownership {src} {dest}; fi'
            )
            owned = dest
        if step.owner:
            lines.append(f"chown -R {shlex.quote(step.owner)} {owned}")
    return "\n".join(lines) + "\n"


def _workdir_script(step: Step) -> str:
    """WORKDIR makes its directory, owned by the user the next steps run as."""
    dest = shlex.quote(step.dest)
    user = step.context.user
    owner = f" && chown {shlex.quote(user)} {dest}" if user not in ("root", "0") else ""
    return f"mkdir -p {dest}{owner}"


def _as_user(user: str, command: str) -> str:
    if user in ("root", "0"):
        return command
    who = shlex.quote(user)
    return (
        f'HOME="$(getent passwd {who} | cut -d: -f6)"; export HOME; USER={who}; export USER; '
        f'exec setpriv --reuid={who} --regid="$(id -g {who})" --init-groups -- /bin/sh -c {shlex.quote(command)}'
    )


class Builder:
    """Builds and imports images on one host, under ``root`` (layers, scratch), into ``blobs``."""

    def __init__(
        self,
        root: Path,
        blobs: BlobStore,
        bases: Bases,
        *,
        uid_base: int = BUILD_UID_BASE,
        pull: Pull | None = None,
    ) -> None:
        """``pull``: how a FROM naming a registry's image is fetched (None: such a FROM is refused)."""
        self.root = root
        self.blobs = blobs
        self.bases = bases
        self.uid_base = uid_base
        self.pull = pull
        self.layers = LayerCache(root / "layers")
        self.scratch_root = root / "scratch"
        shutil.rmtree(self.scratch_root, ignore_errors=True)
        self.scratch_root.mkdir(parents=True)
        os.chmod(self.scratch_root, 0o700)
        self.images = root / "images"  # digest -> the top layer it was packed from, on this host
        self.images.mkdir(exist_ok=True)
        self._locks: dict[str, asyncio.Lock] = {}

    # -- the parts ---------------------------------------------------------------------------------------

    def _scratch(self) -> Path:
        path = self.scratch_root / uuid.uuid4().hex
        path.mkdir()
        return path

    def _lock(self, key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())

    async def _extract(self, sources: list[Path], run: _Run, *, whiteouts: bool, fixups: bool = True) -> Path:
        """``sources`` (tar archives) applied in order into a new partial layer (with the fix-ups
        every image root gets, unless it is a build context)."""
        partial = self.layers.partial()
        job = {
            "job": "extract",
            "uid_base": self.uid_base,
            "target": str(partial),
            "sources": [str(s) for s in sources],
            "limit_bytes": run.limits.disk_mb << 20,
            "whiteouts": whiteouts,
            "fixups": fixups,
        }
        try:
            result = await run_job(job, timeout_s=run.remaining(), log=run.log)
        except JobTimedOut as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise BuildFailed(
                "timeout", "unpacking ran past the build's time limit", output=exc.tail
            ) from None
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        if result.code != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise BuildFailed(
                "refused",
                result.tail.strip().splitlines()[-1] if result.tail.strip() else "unpacking failed",
                output=result.tail,
            )
        return partial

    def _bwrap(self, step: Step | None, run: _Run, command: str) -> list[str]:
        env = dict(step.context.env) if step else {}
        user = step.context.user if step else "root"
        workdir = step.context.workdir if step else "/"
        argv = ["--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--hostname", "build"]
        argv += ["--share-net"] if run.limits.network else ["--unshare-net"]
        # /tmp is the image's own (what a step leaves there is in its layer, as Docker keeps it).
        argv += ["--proc", "/proc", "--dev", "/dev"]
        if run.limits.network and os.path.exists("/etc/resolv.conf"):
            argv += ["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"]
        ca = run.limits.ca_file if run.limits.network else None
        if ca is not None:
            argv += ["--ro-bind", ca, CA_MOUNT]
        argv += ["--clearenv", "--setenv", "PATH", DEFAULT_PATH, "--setenv", "HOME", "/root"]
        for name in CA_VARIABLES if ca is not None else ():
            argv += ["--setenv", name, CA_MOUNT]
        argv += ["--setenv", "LANG", "C.UTF-8", "--setenv", "DEBIAN_FRONTEND", "noninteractive"]
        for name, value in env.items():
            argv += ["--setenv", name, value]
        argv += ["--chdir", "/", "--new-session", "--", "/bin/sh", "-c"]
        wrapped = f"mkdir -p {shlex.quote(workdir)} && cd {shlex.quote(workdir)} && {_as_user(user, command)}"
        return [*argv, wrapped]

    async def _step(
        self,
        parent: str,
        key: str,
        label: str,
        command: str,
        run: _Run,
        *,
        step: Step | None,
        context: Path | None,
    ) -> None:
        async with self._lock(key):
            if self.layers.has(key):
                run.cached += 1
                run.log(f"--> {label} (cached)")
                return
            run.log(f"--> {label}")
            partial = self.layers.partial()
            os.chown(partial, self.uid_base, self.uid_base)
            scratch = self._scratch()
            job = {
                "job": "step",
                "uid_base": self.uid_base,
                "scratch": str(scratch),
                "disk_mb": run.limits.disk_mb,
                "lowers": self.layers.chain(parent),
                "dest": str(partial),
                "ro_binds": [[str(context), CONTEXT_MOUNT]] if context is not None else [],
                "bwrap": self._bwrap(step, run, command),
            }
            line = step.line if step else 0
            try:
                result = await run_job(job, timeout_s=run.remaining(), log=run.log)
                if result.code != 0:
                    reason = "builder" if result.code == HELPER_FAILED else "failed"
                    message = f"{label} exited {result.code}"
                    raise BuildFailed(reason, message, line=line, step=label, output=result.tail)
            except JobTimedOut as exc:
                message = f"{label} ran past the build's time limit"
                shutil.rmtree(partial, ignore_errors=True)
                raise BuildFailed("timeout", message, line=line, step=label, output=exc.tail) from None
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            self.layers.commit(partial, LayerInfo(key=key, parent=parent, step=label))
            run.ran += 1

    async def _base(self, name: str, run: _Run) -> str:
        tarball = await self.bases.tarball(name)
        st = tarball.stat()
        key = layer_key(None, f"base:{canonical(name)}:{FIXUPS}:{st.st_size}:{st.st_mtime_ns}")
        async with self._lock(key):
            if self.layers.has(key):
                run.cached += 1
            else:
                run.log(f"--> FROM {name} (unpacking {tarball.name})")
                partial = await self._extract([tarball], run, whiteouts=False)
                self.layers.commit(partial, LayerInfo(key=key, parent=None, step=f"FROM {name}"))
        return key

    def top_layer_of(self, digest: str) -> str | None:
        """The layer this host packed ``digest`` from, when it still has it."""
        path = self.images / digest.replace(":", "-")
        if not path.exists():
            return None
        key = path.read_text().strip()
        return key if self.layers.has(key) else None

    async def _pack(self, top: str, run: _Run, config: ImageConfig) -> Built:
        scratch = self._scratch()
        try:
            run.log("--> packing the image (erofs, lz4)")
            job = {
                "job": "pack",
                "uid_base": self.uid_base,
                "scratch": str(scratch),
                "lowers": self.layers.chain(top),
            }
            try:
                result = await run_job(job, timeout_s=run.remaining(), log=run.log)
            except JobTimedOut as exc:
                raise BuildFailed(
                    "timeout", "packing ran past the build's time limit", output=exc.tail
                ) from None
            if result.code != 0:
                raise BuildFailed("builder", "packing the image failed", output=result.tail)
            image = scratch / "image.erofs"
            digest = await asyncio.to_thread(digest_file, image)
            size = image.stat().st_size
            await self.blobs.put(digest, image)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        (self.images / digest.replace(":", "-")).write_text(top)
        run.log(f"--> image {digest} ({size >> 20} MB)")
        return Built(
            digest=digest,
            config=config,
            size_bytes=size,
            top_layer=top,
            steps_run=run.ran,
            steps_cached=run.cached,
        )

    def _run(self, limits: BuildLimits, log: Log | None) -> _Run:
        return _Run(deadline=time.monotonic() + limits.timeout_s, log=log or _noop, limits=limits)

    # -- the operations ----------------------------------------------------------------------------------

    async def build(
        self,
        recipe: Recipe,
        *,
        context: Path | None = None,
        parent: tuple[str, ImageConfig] | None = None,
        limits: BuildLimits | None = None,
        log: Log | None = None,
    ) -> Built:
        """Build ``recipe`` (its FROM a base, or ``parent``: the digest and config of the template it
        names, whose layers this host must hold) and put its image in the blob store."""
        run = self._run(limits or BuildLimits(), log)
        layers = await self._layers(recipe, context, parent, run)
        return await self._pack(layers.top, run, layers.config)

    async def build_layers(
        self,
        recipe: Recipe,
        *,
        context: Path | None = None,
        parent: tuple[str, ImageConfig] | None = None,
        limits: BuildLimits | None = None,
        log: Log | None = None,
    ) -> Layers:
        """The steps of ``recipe`` without packing its image (what a build does before it packs)."""
        return await self._layers(recipe, context, parent, self._run(limits or BuildLimits(), log))

    async def _layers(
        self, recipe: Recipe, context: Path | None, parent: tuple[str, ImageConfig] | None, run: _Run
    ) -> Layers:
        if parent is not None:
            top = self.top_layer_of(parent[0])
            if top is None:
                raise BuildFailed(
                    "refused", f"this host does not hold the layers of {recipe.base!r} ({parent[0]})"
                )
            base_config: ImageConfig | None = parent[1]
        elif canonical(recipe.base) is not None:
            top = await self._base(recipe.base, run)
            base_config = None
        elif self.pull is not None and registry.is_reference(recipe.base):
            top, base_config = await self._pulled(recipe.base, run)
        else:
            raise BuildFailed(
                "refused", f"unknown base {recipe.base!r}: registry pulls are not available here"
            )
        for step in recipe.steps:
            label = f"step {step.line}: {step.text}"
            if step.kind == "copy":
                if context is None:
                    raise BuildFailed("refused", "COPY needs a build context", line=step.line, step=label)
                digest = await asyncio.to_thread(context_digest, context, step.sources)
                key = layer_key(top, step.key_text() + digest)
                command, ctx = _copy_script(step), context
            elif step.kind == "workdir":
                key = layer_key(top, step.key_text())
                command, ctx = _workdir_script(step), None
                step = replace(step, context=replace(step.context, user="root"))
            else:
                key = layer_key(top, step.key_text())
                command, ctx = step.command, None
            await self._step(top, key, label, command, run, step=step, context=ctx)
            top = key
        return Layers(
            top=top, config=recipe.config_over(base_config), steps_run=run.ran, steps_cached=run.cached
        )

    async def _pulled(self, ref: str, run: _Run) -> tuple[str, ImageConfig]:
        """A registry image as a base layer (its layers applied, cached by their digests) and its config."""
        assert self.pull is not None
        scratch = self._scratch()
        try:
            run.log(f"--> FROM {ref} (pulling)")
            try:
                archive = await self.pull(ref, scratch / "image.tar", run.remaining())
                found = await asyncio.to_thread(importer.plan, archive, scratch)
            except (registry.RegistryError, ImportRefused) as exc:
                raise BuildFailed("refused", f"FROM {ref}: {exc}", step=f"FROM {ref}") from None
            return await self._imported(found.layers, found.whiteouts, run), found.config
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    async def _imported(self, layers: list[Path], whiteouts: bool, run: _Run) -> str:
        """The layer of tar ``layers`` applied in order, keyed by their digests (unpacked once)."""
        hasher = hashlib.sha256()
        for layer in layers:
            hasher.update((await asyncio.to_thread(digest_file, layer)).encode())
        key = layer_key(None, f"import:{FIXUPS}:{int(whiteouts)}:{hasher.hexdigest()}")
        async with self._lock(key):
            if not self.layers.has(key):
                run.log(f"--> unpacking {len(layers)} layer(s)")
                partial = await self._extract(layers, run, whiteouts=whiteouts)
                self.layers.commit(partial, LayerInfo(key=key, parent=None, step="import"))
        return key

    async def import_layers(
        self,
        layers: list[Path],
        config: ImageConfig,
        *,
        whiteouts: bool,
        limits: BuildLimits | None = None,
        log: Log | None = None,
    ) -> Built:
        """An image from tar layers applied in order (an OCI or docker-save image's, or one plain
        rootfs tarball), with the fix-ups every image gets."""
        run = self._run(limits or BuildLimits(), log)
        key = await self._imported(layers, whiteouts, run)
        return await self._pack(key, run, config)

    async def import_archive(
        self, archive: Path, *, limits: BuildLimits | None = None, log: Log | None = None
    ) -> Built:
        """An image from an OCI layout, a ``docker save`` archive or a plain rootfs tarball."""
        scratch = self._scratch()
        try:
            try:
                found = await asyncio.to_thread(importer.plan, archive, scratch)
            except ImportRefused as exc:
                raise BuildFailed("refused", str(exc)) from None
            if log is not None:
                log(f"--> importing a {found.kind} archive")
            return await self.import_layers(
                found.layers, found.config, whiteouts=found.whiteouts, limits=limits, log=log
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    async def unpack(
        self, sources: list[Path], *, whiteouts: bool, limits: BuildLimits | None = None
    ) -> Path:
        """``sources`` applied into a fresh directory of the layer cache (for inspection; the caller
        removes it)."""
        return await self._extract(sources, self._run(limits or BuildLimits(), None), whiteouts=whiteouts)

    async def stage_context(self, archive: Path | list[Path], limits: BuildLimits | None = None) -> Path:
        """A build context (a tar archive of the files COPY may name, or several applied in order)
        unpacked where steps can read it."""
        run = self._run(limits or BuildLimits(), None)
        archives = archive if isinstance(archive, list) else [archive]
        return await self._extract(archives, run, whiteouts=False, fixups=False)
