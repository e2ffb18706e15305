"""A recipe FROM a registry's image: pulled with skopeo from a registry this test runs on loopback
(Debian's ``docker-registry``), its layers and config the build's base; refused with
``registry_unavailable`` when no registry answers. The image is made here, by hand."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from corral.images import registry
from tests.ci import require
from tests.e2e.procs import free_port
from tests.images.conftest import Api, tar_of
from tests.images.test_builder import mounted

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]

OCI = "application/vnd.oci.image"


def oci_layout(root: Path, tag: str, layers: list[bytes], config: dict[str, object]) -> Path:
    """An OCI image layout directory of one image, media types and all, as a registry takes it."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(data: bytes, media: str) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        (blobs / digest).write_bytes(data)
        return {"mediaType": media, "digest": f"sha256:{digest}", "size": len(data)}

    diff_ids = [f"sha256:{hashlib.sha256(layer).hexdigest()}" for layer in layers]
    body = {
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
        **config,
    }
    manifest = {
        "schemaVersion": 2,
        "mediaType": f"{OCI}.manifest.v1+json",
        "config": blob(json.dumps(body).encode(), f"{OCI}.config.v1+json"),
        "layers": [blob(layer, f"{OCI}.layer.v1.tar") for layer in layers],
    }
    entry = blob(json.dumps(manifest).encode(), f"{OCI}.manifest.v1+json")
    entry["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (root / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (root / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return root


@pytest.fixture
def local_registry(tmp_path: Path) -> Iterator[str]:
    """A registry on loopback (plain HTTP), its address."""
    require(registry.unavailable_reason())
    require(None if shutil.which("docker-registry") else "docker-registry is missing: `make system-deps`")
    port = free_port()
    config = tmp_path / "registry.yml"
    config.write_text(
        f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'registry'}\n"
        f"http:\n  addr: 127.0.0.1:{port}\nlog:\n  level: error\n"
    )
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait()


def push(address: str, layout: Path, tag: str, name: str) -> str:
    ref = f"{address}/{name}:{tag}"
    subprocess.run(
        ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"oci:{layout}:{tag}", f"docker://{ref}"],
        check=True,
        capture_output=True,
    )
    return ref


async def test_a_registry_image_is_the_base_of_a_build(api: Api, local_registry: str, tmp_path: Path) -> None:
    first = tar_of({"etc/os-release": b"ID=pulled\n", "gone": b"whited out by the next layer\n"})
    second = tar_of({".wh.gone": b"", "srv/app.txt": b"from the registry\n"})
    config = {"config": {"Env": ["MODE=pulled"], "WorkingDir": "/srv", "Cmd": ["serve"]}}
    ref = push(local_registry, oci_layout(tmp_path / "layout", "1", [first, second], config), "1", "test/app")

    recipe = f"FROM {ref}\nENV EXTRA=1\n"
    built, logs = await api.wait("pulled", await api.build("pulled", recipe))
    assert built["status"] == "ready", (built, logs)
    assert any("pulling" in line for line in logs), logs
    tpl = await api.c.plane.store.get_template("pulled")
    assert tpl is not None and tpl.image_config is not None
    assert dict(tpl.image_config.env) == {"MODE": "pulled", "EXTRA": "1"}
    assert (tpl.image_config.workdir, tpl.image_config.start_cmd) == ("/srv", "serve")
    blobs = api.c.plane.images.blobs
    assert blobs is not None
    with mounted(blobs.path(built["digest"]), tmp_path / "mnt") as root:  # type: ignore[attr-defined]
        assert (root / "srv" / "app.txt").read_text() == "from the registry\n"
        assert (root / "etc" / "os-release").read_text() == "ID=pulled\n"
        assert not (root / "gone").exists()
        assert (root / "home" / "user").is_dir()  # the fix-ups every image gets

    # A rebuild pulls again and unpacks nothing new: the layers are cached by their digests.
    again, logs = await api.wait("pulled", await api.build("pulled", recipe))
    assert again["status"] == "ready" and again["version"] == 2, (again, logs)
    assert not any("unpacking" in line for line in logs), logs
    assert again["digest"] == built["digest"]


async def test_a_registry_that_does_not_answer_is_refused_before_the_build(api: Api) -> None:
    require(registry.unavailable_reason())
    for ref in (f"127.0.0.1:{free_port()}/test/app:1", "localhost:1/x:1"):
        r = await api.http.post(
            "/v1/templates/nope/builds", json={"recipe": f"FROM {ref}\nRUN true\n"}, headers=api.admin
        )
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "registry_unavailable" and "connection refused" in err["message"], err


def test_a_reference_that_is_not_one_never_reaches_skopeo() -> None:
    for bad in ("--help", "-v", "a b", "x;rm -rf /", "UPPER", "a" * 300, "host/../x", "docker://x"):
        assert not registry.is_reference(bad), bad
    for good in ("python:3.12-slim", "127.0.0.1:5000/test/app:1", "ghcr.io/org/app@sha256:" + "a" * 64):
        assert registry.is_reference(good), good
