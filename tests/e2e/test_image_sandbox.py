"""A template that names an image, end to end on real sandboxes: its image goes into the replica's blob
store, a create fetches it to the host, and the tenant's commands run in the image's own root as its
user, with sudo to root inside, on a disk of the create's size."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from corral.images import digest_file
from corral.store import TemplateRecord
from corral.testing.erofs import small_image
from tests.control.conftest import ADMIN, Cluster, make_cluster

pytestmark = pytest.mark.process


@asynccontextmanager
async def _cluster_with_image(tmp_path: Path) -> AsyncIterator[tuple[Cluster, str]]:
    """One host of the process runtime, and a template ``debian`` of the small base (64 MB disks)."""
    image = small_image()
    digest = digest_file(image)
    c = await make_cluster(tmp_path, hosts=1, memory_mb=4096, cpus=2.0, runtime="process")
    try:
        assert c.plane.images.blobs is not None
        await c.plane.images.blobs.put(digest, image)
        await c.plane.create_template(TemplateRecord("debian", 1.0, 256, image=digest, disk_mb=64))
        yield c, digest
    finally:
        await c.fleet.stop(stop_sandboxes=True)
        await c.close()


async def test_a_sandbox_of_an_image_runs_in_it_as_its_user_with_sudo(tmp_path: Path) -> None:
    async with _cluster_with_image(tmp_path) as (c, digest):
        h = c.as_(ADMIN)
        r = await c.http.post("/v1/sandboxes", json={"template": "debian", "disk_mb": 96}, headers=h)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        assert (r.json()["image"], r.json()["disk_mb"]) == (digest, 96)

        async def run(cmd: str) -> dict:  # type: ignore[type-arg]
            out = await c.http.post(f"/v1/sandboxes/{sid}/exec", json={"command": cmd}, headers=h)
            assert out.status_code == 200, out.text
            return dict(out.json())

        who = await run("id -un; sudo -n id -u; pwd; . /etc/os-release; echo $VERSION_CODENAME")
        assert who["stdout"].split() == ["user", "0", "/home/user", "bookworm"], who
        wrote = await run(
            "echo kept > ~/note && cat ~/note && sudo -n sh -c 'echo root-made > /etc/made' && cat /etc/made"
        )
        assert wrote["stdout"].split() == ["kept", "root-made"], wrote
        # GET shows its disk's size and what the disk holds, read from its host now.
        before = (await c.http.get(f"/v1/sandboxes/{sid}", headers=h)).json()
        assert before["disk_mb"] == 96 and isinstance(before["disk_used_mb"], int)
        await run("head -c 20M /dev/urandom > ~/twenty && sync")
        after = (await c.http.get(f"/v1/sandboxes/{sid}", headers=h)).json()
        assert after["disk_used_mb"] >= before["disk_used_mb"] + 20, (before, after)
        # A list does not read every host: it shows none.
        listed = (await c.http.get("/v1/sandboxes", headers=h)).json()["sandboxes"]
        assert [(s["id"], s["disk_used_mb"]) for s in listed] == [(sid, None)]
        # Its disk is its own size: a write past it stops with ENOSPC.
        full = await run("dd if=/dev/zero of=$HOME/fill bs=1M count=200 2>&1; echo rc=$?")
        assert "No space left on device" in full["stdout"], full
        assert (await c.http.delete(f"/v1/sandboxes/{sid}", headers=h)).status_code == 204


async def test_get_shows_the_disk_used_to_its_owner_only_and_none_without_an_image(tmp_path: Path) -> None:
    async with _cluster_with_image(tmp_path) as (c, _):
        admin = c.as_(ADMIN)
        tokens = {}
        for name in ("acme", "globex"):
            r = await c.http.post("/v1/tenants", json={"name": name}, headers=admin)
            tokens[name] = c.as_(r.json()["token"])
        r = await c.http.post("/v1/sandboxes", json={"template": "debian"}, headers=tokens["acme"])
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        mine = await c.http.get(f"/v1/sandboxes/{sid}", headers=tokens["acme"])
        assert mine.json()["disk_mb"] == 64 and isinstance(mine.json()["disk_used_mb"], int)
        theirs = await c.http.get(f"/v1/sandboxes/{sid}", headers=tokens["globex"])
        assert theirs.status_code == 404 and "disk_used_mb" not in theirs.text
        # A sandbox on the host's own root has no disk of its own: neither a size nor a reading.
        r = await c.http.post("/v1/sandboxes", json={}, headers=tokens["acme"])
        assert r.status_code == 201, r.text
        plain = (await c.http.get(f"/v1/sandboxes/{r.json()['id']}", headers=tokens["acme"])).json()
        assert (plain["disk_mb"], plain["disk_used_mb"]) == (None, None)
