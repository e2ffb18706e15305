"""Importing: OCI layouts and docker-save archives made here (whiteouts honoured), and crafted
tarballs that try to write outside their own root (absolute symlinks, ``..``, hard links to host
files, device nodes, setuid files, a huge sparse file, a layer that whites out ``/``)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import stat
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from corral.images.builder import Builder, BuildFailed, BuildLimits
from corral.images.jail import BUILD_UID_BASE

from .test_builder import mounted

Entry = tuple[str, str, bytes | str, int]  # (kind, name, data or link target, mode)


def layer_tar(entries: list[Entry]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for kind, name, data, mode in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            if kind == "file":
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            if kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, str(data)
            elif kind == "hardlink":
                info.type, info.linkname = tarfile.LNKTYPE, str(data)
            elif kind == "chr":
                info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 8, 0
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            tar.addfile(info)
    return buf.getvalue()


LAYER_1: list[Entry] = [
    ("dir", "etc", b"", 0o755),
    ("file", "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644),
    ("file", "gone", b"removed by the next layer\n", 0o644),
    ("dir", "d", b"", 0o755),
    ("file", "d/old", b"hidden by an opaque dir\n", 0o644),
    ("file", "kept", b"kept\n", 0o644),
]
LAYER_2: list[Entry] = [
    ("file", ".wh.gone", b"", 0o644),
    ("file", "d/.wh..wh..opq", b"", 0o644),
    ("file", "d/new", b"new\n", 0o644),
]
CONFIG = {
    "config": {
        "Env": ["PATH=/usr/bin:/bin", "MODE=imported"],
        "Cmd": ["serve", "--port", "80"],
        "WorkingDir": "/srv",
    }
}


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def oci_archive(path: Path, layers: list[bytes], config: dict[str, object]) -> Path:
    blobs: dict[str, bytes] = {}

    def blob(data: bytes) -> dict[str, object]:
        blobs[_sha(data)] = data
        return {"digest": f"sha256:{_sha(data)}", "size": len(data)}

    config_ref = blob(json.dumps(config).encode())
    manifest = {"schemaVersion": 2, "config": config_ref, "layers": [blob(layer) for layer in layers]}
    index = {"schemaVersion": 2, "manifests": [blob(json.dumps(manifest).encode())]}
    files = {"oci-layout": b'{"imageLayoutVersion": "1.0.0"}', "index.json": json.dumps(index).encode()}
    files |= {f"blobs/sha256/{h}": data for h, data in blobs.items()}
    _write(path, files)
    return path


def docker_archive(path: Path, layers: list[bytes], config: dict[str, object]) -> Path:
    files = {f"{i}/layer.tar": layer for i, layer in enumerate(layers)}
    files["config.json"] = json.dumps(config).encode()
    manifest = [
        {
            "Config": "config.json",
            "RepoTags": ["x:latest"],
            "Layers": [f"{i}/layer.tar" for i in range(len(layers))],
        }
    ]
    files["manifest.json"] = json.dumps(manifest).encode()
    _write(path, files)
    return path


def _write(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("make", [oci_archive, docker_archive], ids=["oci", "docker-save"])
async def test_an_image_archive_imports_with_its_whiteouts_and_config(
    builder: Builder, tmp_path: Path, make: object
) -> None:
    assert callable(make)
    archive = make(tmp_path / "image.tar", [layer_tar(LAYER_1), layer_tar(LAYER_2)], CONFIG)
    built = await builder.import_archive(archive)
    assert built.config.env == {"PATH": "/usr/bin:/bin", "MODE": "imported"}
    assert built.config.start_cmd == "serve --port 80" and built.config.workdir == "/srv"
    with mounted(builder.blobs.path(built.digest), tmp_path / "m") as root:  # type: ignore[attr-defined]
        assert not (root / "gone").exists() and not (root / "d/old").exists()
        assert (root / "d/new").read_text() == "new\n" and (root / "kept").read_text() == "kept\n"
        assert "user:x:1000:1000:" in (root / "etc/passwd").read_text()  # the fix-ups, without a shell
        assert (root / "etc/sudoers.d/user").stat().st_mode & 0o777 == 0o440
        assert stat.S_IMODE((root / "tmp").stat().st_mode) == 0o1777


async def test_a_layer_that_does_not_hash_to_its_digest_is_refused(builder: Builder, tmp_path: Path) -> None:
    archive = oci_archive(tmp_path / "image.tar", [layer_tar(LAYER_1)], CONFIG)
    with tarfile.open(archive) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isreg()}  # type: ignore[union-attr]
    name = next(n for n, data in files.items() if data == layer_tar(LAYER_1))
    files[name] = layer_tar(LAYER_2)
    _write(archive, files)
    with pytest.raises(BuildFailed, match="does not hash"):
        await builder.import_archive(archive)


@pytest.mark.parametrize(
    "content",
    [b"not a tar at all", None],
    ids=["garbage", "manifest-names-a-missing-layer"],
)
async def test_a_malformed_archive_is_refused_clearly(
    builder: Builder, tmp_path: Path, content: bytes | None
) -> None:
    archive = tmp_path / "bad.tar"
    if content is None:
        _write(
            archive, {"manifest.json": json.dumps([{"Config": "c.json", "Layers": ["nope.tar"]}]).encode()}
        )
    else:
        archive.write_bytes(content)
    with pytest.raises(BuildFailed) as caught:
        await builder.import_archive(archive)
    assert caught.value.reason == "refused"


def _host_files(tmp_path: Path) -> tuple[Path, Path]:
    outside = tmp_path / f"outside-{uuid.uuid4().hex}"
    outside.mkdir()
    victim = outside / "victim"
    victim.write_text("untouched\n")
    return outside, victim


ATTACKS: dict[str, list[Entry]] = {
    # An absolute link to a host directory, then a file written through it.
    "absolute-symlink": [("symlink", "abs", "{outside}", 0o777), ("file", "abs/pwned", b"x\n", 0o644)],
    "relative-symlink": [
        ("symlink", "up", "../../../../../../../..{outside}", 0o777),
        ("file", "up/pwned", b"x\n", 0o644),
    ],
    "dotdot-name": [("file", "../../../../../../../..{outside}/pwned", b"x\n", 0o644)],
    "absolute-name": [("file", "{outside}/pwned", b"x\n", 0o644)],
    "hardlink-to-host-file": [("hardlink", "linked", "{outside}/victim", 0o644)],
    "symlink-then-hardlink": [
        ("symlink", "abs", "{outside}", 0o777),
        ("hardlink", "linked", "abs/victim", 0o644),
    ],
    "device-and-fifo": [("chr", "dev/sda", b"", 0o666), ("fifo", "fifo", b"", 0o644)],
    "setuid-root-file": [("file", "usr/bin/suid", b"#!/bin/sh\n", 0o4755)],
    "symlink-loop": [("symlink", "loop", "loop", 0o777), ("file", "loop/x", b"x\n", 0o644)],
}


@pytest.mark.parametrize("name", sorted(ATTACKS))
async def test_a_crafted_tarball_changes_nothing_outside_its_root(
    builder: Builder, tmp_path: Path, name: str
) -> None:
    outside, victim = _host_files(tmp_path)
    entries = [
        (
            kind,
            path.format(outside=outside),
            data.format(outside=outside) if isinstance(data, str) else data,
            mode,
        )
        for kind, path, data, mode in ATTACKS[name]
    ]
    archive = tmp_path / "attack.tar"
    archive.write_bytes(layer_tar(entries))
    try:
        root: Path | None = await builder.unpack([archive], whiteouts=False)
    except BuildFailed as exc:  # refusing is one safe answer
        assert exc.reason == "refused"
        root = None
    try:
        assert sorted(p.name for p in outside.iterdir()) == ["victim"]
        assert victim.read_text() == "untouched\n" and victim.stat().st_nlink == 1
        if root is None:
            return
        assert not (root / "dev/sda").exists() and not (root / "fifo").exists()
        for path in root.rglob("*"):
            st = path.lstat()
            assert st.st_uid >= BUILD_UID_BASE or stat.S_ISCHR(st.st_mode), path  # the build's range
            assert not stat.S_ISBLK(st.st_mode) and not stat.S_ISFIFO(st.st_mode), path
            assert not stat.S_ISCHR(st.st_mode) or st.st_rdev == 0, path
        if name == "setuid-root-file":  # kept (sudo needs it), but setuid to the build's root only
            suid = (root / "usr/bin/suid").stat()
            assert suid.st_mode & 0o4000 and suid.st_uid == BUILD_UID_BASE
    finally:
        if root is not None:
            shutil.rmtree(root)


async def test_a_layer_whiting_out_the_root_empties_only_its_own_root(
    builder: Builder, tmp_path: Path
) -> None:
    outside, victim = _host_files(tmp_path)
    first = tmp_path / "1.tar"
    first.write_bytes(layer_tar([("file", "a", b"a\n", 0o644), ("symlink", "host", str(outside), 0o777)]))
    second = tmp_path / "2.tar"
    second.write_bytes(
        layer_tar(
            [
                ("file", ".wh..wh..opq", b"", 0o644),
                ("file", "../.wh..wh..opq", b"", 0o644),
                ("file", ".wh..", b"", 0o644),
                ("file", "host/.wh.victim", b"", 0o644),
                ("file", "host/.wh..wh..opq", b"", 0o644),
                ("file", "b", b"b\n", 0o644),
            ]
        )
    )
    root = await builder.unpack([first, second], whiteouts=True)
    try:
        assert victim.read_text() == "untouched\n"
        assert not (root / "a").exists() and (root / "b").read_text() == "b\n"
    finally:
        shutil.rmtree(root)


async def test_a_huge_sparse_file_is_refused_not_written(builder: Builder, tmp_path: Path) -> None:
    sparse = tmp_path / "src" / "huge"
    sparse.parent.mkdir()
    with sparse.open("wb") as f:
        f.truncate(1 << 40)  # 1 TB of holes
    archive = tmp_path / "sparse.tar"
    subprocess.run(["tar", "--sparse", "-C", str(sparse.parent), "-cf", str(archive), "huge"], check=True)
    assert archive.stat().st_size < 1 << 20
    free_before = shutil.disk_usage(tmp_path).free
    with pytest.raises(BuildFailed) as caught:
        await builder.unpack([archive], whiteouts=False, limits=BuildLimits(disk_mb=64))
    assert caught.value.reason == "refused" and "more than 64 MB" in caught.value.message
    assert shutil.disk_usage(tmp_path).free > free_before - (64 << 20)
    assert not any(p.name.endswith(".partial") for p in builder.layers.root.iterdir() if os.path.isdir(p))
