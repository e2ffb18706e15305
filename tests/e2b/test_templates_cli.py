"""``corral templates`` against a real ``corral serve`` that builds: a recipe and its context built
(the log followed), rebuilt as the next version, listed with its digest, version and size; a sandbox of
it ready once its ready check passed; a failing build ends the command non-zero with its step and
output; an imported tarball; a removal. The builds take the small base from the test cache."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from corral.control.builds import unavailable_reason
from corral.testing.images import small_base
from tests.ci import require
from tests.e2b.conftest import ADMIN_TOKEN, Corral
from tests.images.test_template_api import RECIPE

pytestmark = pytest.mark.timeout(300)


def templates(corral: Corral, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_URL": corral.url, "CORRAL_TOKEN": ADMIN_TOKEN}
    return subprocess.run(
        [sys.executable, "-m", "corral", "templates", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def listed(corral: Corral) -> dict[str, dict[str, Any]]:
    done = templates(corral, "ls", "--json")
    assert done.returncode == 0, done.stderr
    return {t["name"]: t for t in json.loads(done.stdout)["templates"]}


def test_build_ls_rm_and_a_ready_sandbox_from_the_command_line(corral: Corral, tmp_path: Path) -> None:
    require(unavailable_reason())
    small_base()
    name = f"cli-{time.monotonic_ns()}"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "hello.txt").write_text("hello from the cli\n")
    for version in (1, 2):
        recipe = tmp_path / "Recipe"
        recipe.write_text(RECIPE.format(version=f"v{version}"))
        done = templates(corral, "build", name, "-f", str(recipe), str(tmp_path / "ctx"))
        assert done.returncode == 0, done.stdout + done.stderr
        assert "--> step 2: COPY" in done.stdout and f"template {name}: version {version}" in done.stdout
    assert "(cached)" in done.stdout  # the rebuild reran only the changed step and after
    mine = listed(corral)[name]
    assert mine["version"] == 2 and mine["image"].startswith("sha256:") and mine["size_bytes"] > 0

    r = corral.admin.post("/v1/sandboxes", json={"template": name})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    try:
        out = corral.admin.post(
            f"/v1/sandboxes/{sid}/exec", json={"command": "cat /tmp/started /srv/version"}
        )
        assert out.json()["stdout"] == "hello from the cli\nv2\n", out.text
    finally:
        corral.admin.delete(f"/v1/sandboxes/{sid}")

    table = templates(corral, "ls")
    assert name in table.stdout and mine["image"] in table.stdout
    assert templates(corral, "rm", name).returncode == 0
    assert name not in listed(corral)
    again = templates(corral, "rm", name)
    assert again.returncode == 1 and "not_found" in again.stderr


def test_a_failing_build_exits_non_zero_with_its_step_and_output(corral: Corral, tmp_path: Path) -> None:
    require(unavailable_reason())
    small_base()
    recipe = tmp_path / "Recipe"
    recipe.write_text("FROM debian:bookworm\nRUN echo fine\nRUN echo 'it broke here' >&2; exit 3\n")
    done = templates(corral, "build", f"failing-{time.monotonic_ns()}", "-f", str(recipe))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the build failed at step 3: RUN echo 'it broke here' >&2; exit 3" in done.stderr
    assert "it broke here" in done.stderr
    registry = tmp_path / "Registry"
    registry.write_text("FROM python:3.12-slim\nRUN true\n")
    refused = templates(corral, "build", "registry", "-f", str(registry))
    assert refused.returncode == 1 and "registry_unavailable" in refused.stderr, refused.stderr


def test_import_a_rootfs_tarball_from_the_command_line(corral: Corral, tmp_path: Path) -> None:
    require(unavailable_reason())
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("etc/os-release")
        info.size = 12
        tar.addfile(info, io.BytesIO(b"ID=imported\n"))
    archive = tmp_path / "rootfs.tar"
    archive.write_bytes(buffer.getvalue())
    name = f"imported-{time.monotonic_ns()}"
    done = templates(corral, "import", name, str(archive), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["version"] == 1
    assert listed(corral)[name]["version"] == 1
