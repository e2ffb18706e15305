"""Importing an image built anywhere: an OCI image layout, a ``docker save`` archive or a plain rootfs
tarball, told apart by what the outer archive holds. The outer archive is only read (its index and
manifests parsed, its layer blobs copied out as regular files under names of our choosing); the layers
are applied by the builder's chrooted extractor (whiteouts honoured), never here.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.images.config import ImageConfig

MAX_MANIFEST_BYTES = 4 << 20
MAX_LAYERS = 128


class ImportRefused(ValueError):
    """The archive is not an image corral can import; the message says why."""


@dataclass(frozen=True, slots=True)
class ImportPlan:
    kind: str  # "oci", "docker-save" or "rootfs"
    layers: list[Path]  # tar streams to apply in order (the archive itself for a rootfs)
    config: ImageConfig
    whiteouts: bool


def _member(tar: tarfile.TarFile, name: str) -> tarfile.TarInfo:
    wanted = posixpath.normpath(name.lstrip("/"))
    for member in tar.getmembers():
        if posixpath.normpath(member.name.lstrip("/")) == wanted and member.isreg():
            return member
    raise ImportRefused(f"the archive names {name[:120]!r} but does not hold it")


def _json(tar: tarfile.TarFile, name: str) -> Any:
    member = _member(tar, name)
    if member.size > MAX_MANIFEST_BYTES:
        raise ImportRefused(f"{name[:120]} is larger than {MAX_MANIFEST_BYTES >> 20} MB")
    f = tar.extractfile(member)
    assert f is not None
    try:
        return json.loads(f.read())
    except ValueError:
        raise ImportRefused(f"{name[:120]} is not JSON") from None


def _blob_name(digest: Any) -> str:
    if not isinstance(digest, str) or not digest.startswith("sha256:") or len(digest) != 71:
        raise ImportRefused(f"not a sha256 digest: {str(digest)[:80]!r}")
    hexpart = digest[7:]
    if any(c not in "0123456789abcdef" for c in hexpart):
        raise ImportRefused(f"not a sha256 digest: {digest[:80]!r}")
    return f"blobs/sha256/{hexpart}"


def _copy_out(tar: tarfile.TarFile, name: str, dest: Path, digest: str | None) -> Path:
    """A layer blob copied to ``dest`` (checked against its digest when the format names one)."""
    member = _member(tar, name)
    source = tar.extractfile(member)
    assert source is not None
    h = hashlib.sha256()
    with dest.open("wb") as out:
        while chunk := source.read(1 << 20):
            h.update(chunk)
            out.write(chunk)
    if digest is not None and f"sha256:{h.hexdigest()}" != digest:
        raise ImportRefused(f"the layer {name[:120]} does not hash to its digest")
    return dest


def _config_of(image_config: Any) -> ImageConfig:
    """An OCI/Docker image config's runtime part, as corral's (Env, User, WorkingDir, Cmd)."""
    body = image_config.get("config") if isinstance(image_config, dict) else None
    if not isinstance(body, dict):
        return ImageConfig()
    env: dict[str, str] = {}
    for item in body.get("Env") or []:
        if isinstance(item, str) and "=" in item:
            name, _, value = item.partition("=")
            env[name] = value
    cmd = [*(body.get("Entrypoint") or []), *(body.get("Cmd") or [])]
    start = " ".join(str(part) for part in cmd) if cmd else None
    user = body.get("User") or ""
    workdir = body.get("WorkingDir") or ""
    return ImageConfig(
        env=env,
        user=str(user).partition(":")[0] or ImageConfig().user,
        workdir=str(workdir) or ImageConfig().workdir,
        start_cmd=start,
    )


def plan(archive: Path, scratch: Path) -> ImportPlan:
    """What importing ``archive`` means: its kind, its layers (copied under ``scratch``) and config."""
    try:
        tar = tarfile.open(archive, mode="r:*")  # noqa: SIM115 (closed by the with below)
    except (tarfile.TarError, OSError) as exc:
        raise ImportRefused(f"not a tar archive: {exc}") from None
    with tar:
        try:
            names = {posixpath.normpath(m.name.lstrip("/")) for m in tar.getmembers()}
        except (tarfile.TarError, EOFError) as exc:
            raise ImportRefused(f"the archive cannot be read: {exc}") from None
        if "oci-layout" in names and "index.json" in names:
            return _oci(tar, scratch)
        if "manifest.json" in names:
            return _docker_save(tar, scratch)
    return ImportPlan(kind="rootfs", layers=[archive], config=ImageConfig(), whiteouts=False)


def _layers(tar: tarfile.TarFile, scratch: Path, names: Sequence[tuple[str, str | None]]) -> list[Path]:
    if not names or len(names) > MAX_LAYERS:
        raise ImportRefused(f"an image has 1 to {MAX_LAYERS} layers, this one {len(names)}")
    return [
        _copy_out(tar, name, scratch / f"layer-{i:03d}.tar", digest) for i, (name, digest) in enumerate(names)
    ]


def _oci(tar: tarfile.TarFile, scratch: Path) -> ImportPlan:
    index = _json(tar, "index.json")
    manifests = index.get("manifests") if isinstance(index, dict) else None
    if not isinstance(manifests, list) or not manifests or not isinstance(manifests[0], dict):
        raise ImportRefused("index.json lists no manifest")
    manifest = _json(tar, _blob_name(manifests[0].get("digest")))
    if isinstance(manifest, dict) and isinstance(manifest.get("manifests"), list):  # an index inside
        inner = manifest["manifests"]
        if not inner or not isinstance(inner[0], dict):
            raise ImportRefused("the image index lists no manifest")
        manifest = _json(tar, _blob_name(inner[0].get("digest")))
    if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
        raise ImportRefused("the manifest lists no layers")
    config_ref = manifest.get("config")
    config = (
        _config_of(_json(tar, _blob_name(config_ref.get("digest"))))
        if isinstance(config_ref, dict)
        else ImageConfig()
    )
    refs = []
    for layer in manifest["layers"]:
        digest = layer.get("digest") if isinstance(layer, dict) else None
        refs.append((_blob_name(digest), str(digest)))
    return ImportPlan(kind="oci", layers=_layers(tar, scratch, refs), config=config, whiteouts=True)


def _docker_save(tar: tarfile.TarFile, scratch: Path) -> ImportPlan:
    manifest = _json(tar, "manifest.json")
    if not isinstance(manifest, list) or not manifest or not isinstance(manifest[0], dict):
        raise ImportRefused("manifest.json lists no image")
    entry = manifest[0]
    layers = entry.get("Layers")
    if not isinstance(layers, list) or not all(isinstance(name, str) for name in layers):
        raise ImportRefused("manifest.json's image lists no layers")
    config_name = entry.get("Config")
    config = _config_of(_json(tar, config_name)) if isinstance(config_name, str) else ImageConfig()
    return ImportPlan(
        kind="docker-save",
        layers=_layers(tar, scratch, [(name, None) for name in layers]),
        config=config,
        whiteouts=True,
    )


def discard(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
