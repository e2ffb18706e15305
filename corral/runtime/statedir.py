"""The runtime's state directory: each sandbox's state on disk, so a runtime object (or a restarted agent) can find,
verify and re-adopt the sandboxes an earlier one started.

Layout under the runtime's root, one directory per sandbox::

    <root>/<id>/starting.json   written before anything is created; names the cgroup and the starter
    <root>/<id>/sandbox.json    written atomically once the sandbox runs; replaces starting.json

The root and every directory in it are 0700 and every file 0600: a record holds the sandbox's
environment, which may carry its secrets. Only the runtime writes here (no process of a sandbox holds
a descriptor to anything under the root), once per start, from a bounded spec.

A directory with only ``starting.json`` whose starter is no longer alive is what a crash mid-start
leaves; it names everything that must be torn down.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.runtime.base import DEFAULT_PIDS, SandboxSpec
from corral.runtime.procfs import ProcessIdentity

# Ids become directory and cgroup names: keep them to a safe, bounded alphabet.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
RECORD = "sandbox.json"
MARKER = "starting.json"


def valid_id(sandbox_id: str) -> bool:
    return bool(_ID.match(sandbox_id)) and ".." not in sandbox_id


def spec_to_dict(spec: SandboxSpec) -> dict[str, Any]:
    return {
        "id": spec.id,
        "memory_mb": spec.memory_mb,
        "cpus": spec.cpus,
        "template": spec.template,
        "stateful": spec.stateful,
        "hostname": spec.hostname,
        "env": dict(spec.env),
        "network": spec.network,
        "netns": spec.netns,
        "nameserver": spec.nameserver,
        "pids": spec.pids,
        "epoch": spec.epoch,
        "image": spec.image,
        "disk_mb": spec.disk_mb,
        "user": spec.user,
        "workdir": spec.workdir,
        "leased": spec.leased,
    }


def spec_from_dict(data: dict[str, Any]) -> SandboxSpec:
    return SandboxSpec(
        id=str(data["id"]),
        memory_mb=int(data["memory_mb"]),
        cpus=float(data["cpus"]),
        template=str(data["template"]),
        stateful=bool(data["stateful"]),
        hostname=data["hostname"],
        env={str(k): str(v) for k, v in data["env"].items()},
        network=bool(data["network"]),
        netns=data.get("netns"),
        nameserver=_optional_str(data.get("nameserver")),
        pids=int(data.get("pids", DEFAULT_PIDS)),
        epoch=int(data.get("epoch", 0)),
        image=_optional_str(data.get("image")),
        disk_mb=None if data.get("disk_mb") is None else int(data["disk_mb"]),
        user=_optional_str(data.get("user")),
        workdir=_optional_str(data.get("workdir")),
        leased=bool(data.get("leased", False)),
    )


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _identity(data: dict[str, Any]) -> ProcessIdentity:
    return ProcessIdentity(int(data["pid"]), int(data["start_ticks"]), int(data["pid_ns"]))


def _identity_dict(identity: ProcessIdentity) -> dict[str, int]:
    return {"pid": identity.pid, "start_ticks": identity.start_ticks, "pid_ns": identity.pid_ns}


@dataclass(frozen=True, slots=True)
class Starting:
    """Intent, recorded before any resource exists."""

    starter: ProcessIdentity  # the agent process doing the start
    cgroup: str | None
    cgroup_version: int | None
    cgroup_extra: tuple[str, ...] = ()  # v1: the sandbox's cgroups in the cpu, pids and freezer hierarchies
    image: str | None = None  # the image its root is made of: a crashed start's teardown releases it

    def to_dict(self) -> dict[str, Any]:
        return {
            "starter": _identity_dict(self.starter),
            "cgroup": self.cgroup,
            "cgroup_version": self.cgroup_version,
            "cgroup_extra": list(self.cgroup_extra),
            "image": self.image,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Starting:
        extra = tuple(str(p) for p in data.get("cgroup_extra", ()))
        image = _optional_str(data.get("image"))
        return cls(_identity(data["starter"]), data["cgroup"], data["cgroup_version"], extra, image)


@dataclass(frozen=True, slots=True)
class Running:
    """A started sandbox: its spec and how to find, verify and reach it."""

    spec: SandboxSpec
    started_at: float
    init: ProcessIdentity  # pid 1 of the sandbox's pid namespace, seen from the host
    monitor: ProcessIdentity  # bubblewrap's outer process, the init's parent
    cgroup: str | None
    cgroup_version: int | None
    cgroup_extra: tuple[str, ...] = ()
    uid: int | None = None  # the host uid leased to it (None: it runs as the runtime's own)
    # How many host uids from ``uid`` its user namespace maps (an image's sandbox: a whole range,
    # ``uid`` being its root inside); its disk file, when it has one.
    uid_span: int = 1
    disk: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec": spec_to_dict(self.spec),
            "started_at": self.started_at,
            "init": _identity_dict(self.init),
            "monitor": _identity_dict(self.monitor),
            "cgroup": self.cgroup,
            "cgroup_version": self.cgroup_version,
            "cgroup_extra": list(self.cgroup_extra),
            "uid": self.uid,
            "uid_span": self.uid_span,
            "disk": self.disk,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Running:
        return cls(
            spec=spec_from_dict(data["spec"]),
            started_at=float(data["started_at"]),
            init=_identity(data["init"]),
            monitor=_identity(data["monitor"]),
            cgroup=data["cgroup"],
            cgroup_version=data["cgroup_version"],
            cgroup_extra=tuple(str(p) for p in data.get("cgroup_extra", ())),
            uid=None if data.get("uid") is None else int(data["uid"]),
            uid_span=int(data.get("uid_span", 1)),
            disk=_optional_str(data.get("disk")),
        )


class Corrupt:
    """A sandbox directory whose record cannot be read (torn by hand, or by a full disk)."""


Record = Starting | Running | Corrupt


def _write_atomically(path: Path, data: dict[str, Any]) -> None:
    # Atomic against an agent crash (a reader sees the old file or the new one, never half of one).
    # No fsync: the state files describe processes, which a host crash ends anyway.
    tmp = path.with_name(path.name + ".tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600), "w") as fh:
        json.dump(data, fh)
    os.replace(tmp, path)


class StateDir:
    """The sandbox directories under one root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        # Private: its files hold each sandbox's environment, which may carry its secrets.
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)  # also when it existed, made by an older version or by hand

    def dir(self, sandbox_id: str) -> Path:
        return self.root / sandbox_id

    def claim(self, sandbox_id: str, starting: Starting) -> Path:
        """Create the sandbox's directory with its intent already inside (so no reader ever sees an
        empty one); FileExistsError when the id is taken."""
        path = self.dir(sandbox_id)
        if path.exists():
            raise FileExistsError(path)
        # A leading dot keeps the staging directory out of ids().
        staging = Path(tempfile.mkdtemp(prefix=f".{sandbox_id}.", dir=self.root))
        try:
            _write_atomically(staging / MARKER, starting.to_dict())
            os.rename(staging, path)  # refused when the id was taken meanwhile (target not empty)
        except OSError as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, FileExistsError) or exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                raise FileExistsError(path) from exc
            raise
        return path

    def commit(self, sandbox_id: str, running: Running) -> None:
        path = self.dir(sandbox_id)
        _write_atomically(path / RECORD, running.to_dict())
        (path / MARKER).unlink(missing_ok=True)

    def load(self, sandbox_id: str) -> Record | None:
        path = self.dir(sandbox_id)
        try:
            if (path / RECORD).exists():
                return Running.from_dict(json.loads((path / RECORD).read_text()))
            if (path / MARKER).exists():
                return Starting.from_dict(json.loads((path / MARKER).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return Corrupt() if path.is_dir() else None
        return Corrupt() if path.is_dir() else None

    def ids(self) -> Iterator[str]:
        for entry in sorted(self.root.iterdir()):
            if entry.is_dir() and valid_id(entry.name):
                yield entry.name

    def discard(self, sandbox_id: str) -> None:
        shutil.rmtree(self.dir(sandbox_id), ignore_errors=True)
