"""corral's own template API end to end, on real build sandboxes and real sandboxes: a recipe and its
context built into a template whose sandboxes run its start command and are ready when its ready
check passes; a rebuild is the next version while running sandboxes keep theirs, and the old image is
collected once none is left; a failing step, a cancelled build, an import; and what a hostile caller
tries (a tenant's token, bad names, an oversize recipe, a registry FROM, a context that climbs out).

The builds reuse the session's builder root (the small base unpacked once)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import tarfile
import uuid
from pathlib import Path

import pytest

from corral.api import templates as template_routes
from corral.store import TemplateRecord
from tests.images.conftest import Api, tar_of

pytestmark = [pytest.mark.process, pytest.mark.timeout(300)]


RECIPE = """\
FROM debian:bookworm
COPY hello.txt /srv/hello.txt
RUN echo {version} > /srv/version
CMD cp /srv/hello.txt /tmp/started && sleep infinity
READY test -f /tmp/started
"""


async def test_a_built_template_starts_ready_sandboxes_and_a_rebuild_is_its_next_version(api: Api) -> None:
    context = tar_of({"hello.txt": b"hello from the context\n"})
    built, logs = await api.wait("web", await api.build("web", RECIPE.format(version="v1"), context))
    assert built["status"] == "ready" and built["version"] == 1, (built, logs)
    first = built["digest"]
    listed = (await api.templates())["web"]
    assert (listed["image"], listed["version"]) == (first, 1)
    assert listed["size_bytes"] > 0

    # The create answered once the ready check passed: the start command had run, and runs on.
    r = await api.create("web")
    assert r.status_code == 201, r.text
    old_sandbox = r.json()["id"]
    assert await api.run(old_sandbox, "cat /tmp/started /srv/version") == "hello from the context\nv1\n"

    # A rebuild with its last filesystem step changed: the steps before are cached, a new version.
    rebuilt, logs = await api.wait("web", await api.build("web", RECIPE.format(version="v2"), context))
    assert rebuilt["status"] == "ready" and rebuilt["version"] == 2, (rebuilt, logs)
    assert any("COPY" in line and "(cached)" in line for line in logs), logs
    second = rebuilt["digest"]
    assert second != first
    assert ((await api.templates())["web"]["version"], (await api.templates())["web"]["image"]) == (2, second)
    r = await api.create("web")
    assert r.status_code == 201, r.text
    assert await api.run(r.json()["id"], "cat /srv/version") == "v2\n"
    # The sandbox started on version 1 keeps its image.
    assert await api.run(old_sandbox, "cat /srv/version") == "v1\n"

    # The old image is kept while its sandbox lives, and collected once it is gone (after the grace).
    gc = api.c.plane.image_gc
    assert gc is not None and api.c.plane.images.blobs is not None
    assert await gc.sweep() == []
    assert (await api.http.delete(f"/v1/sandboxes/{old_sandbox}", headers=api.admin)).status_code == 204
    assert await gc.sweep() == []  # unnamed from now: a build may just have put it
    api.c.clock.advance(gc.grace_s + 1)
    assert await gc.sweep() == [first]
    assert set(await api.c.plane.images.blobs.digests()) == {second}


async def test_a_failing_step_is_named_with_its_output_and_names_no_template(api: Api) -> None:
    recipe = "FROM debian:bookworm\nRUN echo fine\nRUN echo broken >&2; exit 3\n"
    failed, _ = await api.wait("broken", await api.build("broken", recipe))
    assert failed["status"] == "error", failed
    failure = failed["failure"]
    assert failure["reason"] == "failed" and failure["line"] == 3, failure
    assert "exit 3" in failure["step"] and "exited 3" in failure["message"], failure
    assert "broken" in failure["output"], failure
    assert "broken" not in await api.templates()


async def test_a_ready_check_that_never_passes_refuses_the_create_and_leaves_no_sandbox(api: Api) -> None:
    recipe = "FROM debian:bookworm\nCMD sleep infinity\nREADY echo not yet; false\n"
    built, logs = await api.wait("never", await api.build("never", recipe))
    assert built["status"] == "ready", (built, logs)
    assert api.c.plane.creates.ready is not None
    api.c.plane.creates.ready.timeout_s = 1.0
    for _ in range(2):  # the same Idempotency-Key, retried, tries anew (the refusal left no trace)
        r = await api.http.post(
            "/v1/sandboxes", json={"template": "never"}, headers={**api.admin, "Idempotency-Key": "k1"}
        )
        assert r.status_code == 422, r.text
        err = r.json()["error"]
        assert err["code"] == "sandbox_not_ready" and "not yet" in err["details"]["output"], err
    # A batch is refused whole: none of its sandboxes is left.
    batch = {"count": 2, "spec": {"template": "never"}}
    r = await api.http.post("/v1/sandboxes/batch", json=batch, headers=api.admin)
    assert r.status_code == 422 and r.json()["error"]["code"] == "sandbox_not_ready", r.text
    listed = await api.http.get("/v1/sandboxes", headers=api.admin)
    assert [s for s in listed.json()["sandboxes"] if s["state"] != "deleted"] == [], listed.text
    for agent in api.c.fleet.agents:
        assert await agent.runtime.list() == []  # stopped on its host, not only forgotten


async def test_a_cancelled_build_ends_and_names_no_template(api: Api) -> None:
    build = await api.build("slow", "FROM debian:bookworm\nRUN sleep 300\n")
    path = f"/v1/templates/slow/builds/{build['id']}"
    offset, seen = 0, []
    while not any("sleep 300" in line for line in seen):
        got = (await api.http.get(path, params={"offset": offset, "wait_s": 5}, headers=api.admin)).json()
        assert got["status"] in ("waiting", "building"), got
        seen += got["logs"]
        offset = got["next_offset"]
    r = await api.http.post(f"{path}/cancel", headers=api.admin)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "error" and r.json()["failure"]["reason"] == "cancelled", r.text
    assert "slow" not in await api.templates()


async def test_an_imported_rootfs_tarball_is_a_template_and_a_reimport_its_next_version(api: Api) -> None:
    archive = tar_of({"etc/os-release": b"ID=imported\n", "srv/app.txt": b"app\n"})
    for version in (1, 3):
        r = await api.http.post("/v1/templates/imported/imports", content=archive, headers=api.admin)
        assert r.status_code == 202, r.text
        done, logs = await api.wait("imported", r.json())
        assert done["status"] == "ready" and done["version"] == version, (done, logs)
        if version == 1:
            # What an operator set on the template that a build does not (its failover policy) is kept.
            store = api.service.plane.store
            first = await store.get_template("imported")
            assert first is not None
            await store.publish_template(dataclasses.replace(first, failover="recreate", version=2))
    assert (await api.templates())["imported"]["version"] == 3
    kept = await api.service.plane.store.get_template("imported")
    assert kept is not None and kept.failover == "recreate"


async def test_a_registry_from_is_refused_with_its_code(api: Api) -> None:
    for base in ("python:3.12-slim", "ghcr.io/someone/image:1"):
        body = {"recipe": f"FROM {base}\nRUN true\n"}
        r = await api.http.post("/v1/templates/reg/builds", json=body, headers=api.admin)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["code"] == "registry_unavailable", r.text
        assert "registry" in r.json()["error"]["message"]


async def test_a_tenant_writes_no_template_and_sees_only_its_own(api: Api) -> None:
    body = {"recipe": "FROM debian:bookworm\nRUN true\n"}
    some_id = str(uuid.uuid4())
    for method, path, kwargs in (
        ("POST", "/v1/templates/mine/builds", {"json": body}),
        ("POST", "/v1/templates/mine/imports", {"content": tar_of({"a": b"a"})}),
        ("PUT", f"/v1/templates/mine/builds/{some_id}/context", {"content": b""}),
        ("GET", f"/v1/templates/mine/builds/{some_id}", {}),
        ("POST", f"/v1/templates/mine/builds/{some_id}/cancel", {}),
        ("DELETE", "/v1/templates/default", {}),
    ):
        r = await api.http.request(method, path, headers=api.tenant, **kwargs)
        assert r.status_code == 403, (method, path, r.text)
    assert "default" in await api.templates()

    # Another tenant's templates (its E2B namespace) are not listed to this one; its own are.
    other = "tn_0123456789abcdef.secret"
    own = f"{api.tenant_id}.own"
    for name in (other, own):
        await api.c.plane.create_template(TemplateRecord(name, 1.0, 256))
    seen = await api.templates(api.tenant)
    assert own in seen and other not in seen and "default" in seen
    assert other in await api.templates()


async def test_bad_names_recipes_and_build_ids_are_refused_with_422(api: Api) -> None:
    good = {"recipe": "FROM debian:bookworm\nRUN true\n"}
    for name in ("tn_0123456789abcdef.x", "-dash", "a%20b", "x" * 129):
        r = await api.http.post(f"/v1/templates/{name}/builds", json=good, headers=api.admin)
        assert r.status_code == 422, (name, r.text)
    for recipe in ("FROM debian:bookworm\n" + "RUN true\n" * 40_000, "NOPE x\n", "RUN true\n", ""):
        r = await api.http.post("/v1/templates/t/builds", json={"recipe": recipe}, headers=api.admin)
        assert r.status_code == 422, r.text[:300]
        assert r.json()["error"]["code"] == "invalid_request"
    # A slash smuggled into the id makes another path, which no route has; an id not of a build's
    # shape is refused by name.
    for build_id, status, code in (
        ("..%2F..%2Fetc", 404, "not_found"),
        ("not-a-build-id", 422, "invalid_request"),
    ):
        r = await api.http.get(f"/v1/templates/t/builds/{build_id}", headers=api.admin)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
        r = await api.http.put(f"/v1/templates/t/builds/{build_id}/context", content=b"x", headers=api.admin)
        assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    unknown = uuid.uuid4()
    r = await api.http.get(f"/v1/templates/t/builds/{unknown}", headers=api.admin)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    r = await api.http.put(f"/v1/templates/t/builds/{unknown}/context", content=b"x", headers=api.admin)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text
    # An import's sizes and name are checked before its archive is read: bad ones are 422 and start
    # nothing.
    for params in ({"cpus": "0"}, {"memory_mb": "1"}, {"memory_mb": "-5"}, {"disk_mb": "1"}, {"cpus": "nan"}):
        r = await api.http.post("/v1/templates/imp/imports", params=params, content=b"x", headers=api.admin)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", (params, r.text)
    r = await api.http.post("/v1/templates/tn_0123456789abcdef.x/imports", content=b"x", headers=api.admin)
    assert r.status_code == 422, r.text
    assert all(
        t["name"] != "imp"
        for t in (await api.http.get("/v1/templates", headers=api.admin)).json()["templates"]
    )


async def test_a_context_is_taken_once_within_its_cap_and_never_climbs_out(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    recipe = "FROM debian:bookworm\nCOPY . /srv/ctx/\nRUN ls -la /srv/ctx > /srv/listing\n"
    # A build that asked for no context takes none.
    started = await api.build("noctx", "FROM debian:bookworm\nRUN true\n")
    r = await api.http.put(
        f"/v1/templates/noctx/builds/{started['id']}/context", content=b"x", headers=api.admin
    )
    assert r.status_code == 409, r.text

    # Over the cap: 413 before the build starts, which then ends as cancelled.
    monkeypatch.setitem(template_routes.UPLOAD_CAPS, "context", 1024)
    body = {"recipe": recipe, "context": True}
    r = await api.http.post("/v1/templates/big/builds", json=body, headers=api.admin)
    big = r.json()["id"]
    r = await api.http.put(f"/v1/templates/big/builds/{big}/context", content=b"x" * 4096, headers=api.admin)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large", r.text
    monkeypatch.undo()

    # Members that climb out and absolute paths land inside the context.
    marker = f"escape-{uuid.uuid4().hex}"
    climbing = tar_of({f"../../{marker}": b"bad", f"/tmp/{marker}": b"bad", "ok.txt": b"ok"})
    built, logs = await api.wait("ctx", await api.build("ctx", recipe, climbing))
    assert built["status"] == "ready", (built, logs)
    r = await api.create("ctx")
    assert r.status_code == 201, r.text
    listing = await api.run(r.json()["id"], "cat /srv/listing")
    assert "ok.txt" in listing and marker in listing, listing
    # A member through a symlink out of the context: the archive is refused.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        link = tarfile.TarInfo("out")
        link.type, link.linkname = tarfile.SYMTYPE, str(tmp_path)
        tar.addfile(link)
        through = tarfile.TarInfo(f"out/{marker}")
        through.size = 3
        tar.addfile(through, io.BytesIO(b"bad"))
    refused, logs = await api.wait("ctx", await api.build("ctx", recipe, buffer.getvalue()))
    assert refused["status"] == "error" and refused["failure"]["reason"] == "refused", (refused, logs)
    assert "archive" in refused["failure"]["message"], refused
    for outside in (
        Path("/tmp") / marker,
        tmp_path / marker,
        api.service.root.parent / marker,
        Path("/") / marker,
    ):
        assert not outside.exists(), outside
    # The upload is gone once the build ended.
    assert not list((api.service.root / "contexts").glob("*.tar"))
    # A second context for a started build is refused.
    r = await api.http.put(f"/v1/templates/ctx/builds/{built['id']}/context", content=b"x", headers=api.admin)
    assert r.status_code == 409, r.text


async def test_rm_removes_a_template_but_not_one_with_a_pool(api: Api) -> None:
    await api.c.plane.create_template(TemplateRecord("gone", 1.0, 256))
    assert (await api.http.delete("/v1/templates/gone", headers=api.admin)).status_code == 204
    r = await api.http.delete("/v1/templates/gone", headers=api.admin)
    assert r.status_code == 404, r.text
    await api.c.plane.create_template(TemplateRecord("pooled", 1.0, 256))
    await api.c.plane.store.create_pool("pooled", size=0)
    r = await api.http.delete("/v1/templates/pooled", headers=api.admin)
    assert r.status_code == 409, r.text
    assert "pooled" in await api.templates()
    r = await api.http.delete("/v1/templates/default", headers=api.admin)
    assert r.status_code == 409 and "default" in await api.templates(), r.text


async def test_a_claimed_warm_sandbox_runs_its_start_command_before_the_create_answers(api: Api) -> None:
    recipe = "FROM debian:bookworm\nCMD touch /tmp/started && sleep infinity\nREADY test -f /tmp/started\n"
    built, logs = await api.wait("warm", await api.build("warm", recipe))
    assert built["status"] == "ready", (built, logs)
    r = await api.http.post("/v1/pools", json={"template": "warm", "size": 1}, headers=api.admin)
    assert r.status_code == 201, r.text
    c = api.c
    for _ in range(300):  # the pool fills on the leader's rounds and the agent's refills
        await c.plane.reconciler.tick()
        await c.beat()
        for a in c.fleet.agents:
            a.replenish()
        if sum(a.warm.ready_count("warm") for a in c.fleet.agents) == 1:
            break
        await asyncio.sleep(0.1)
    assert sum(a.warm.ready_count("warm") for a in c.fleet.agents) == 1
    r = await api.create("warm")
    assert r.status_code == 201 and r.json()["warm"] is True, r.text
    assert await api.run(r.json()["id"], "ls /tmp/started") == "/tmp/started\n"


async def test_a_replayed_create_answers_once_its_sandbox_is_ready_too(api: Api) -> None:
    # The start command takes a while before the ready check can pass: a client that retries its
    # create (the same Idempotency-Key) while the first still waits must not be handed the sandbox
    # before it is ready, nor start the start command a second time.
    recipe = (
        "FROM debian:bookworm\n"
        "CMD echo run >> /tmp/runs && sleep 1 && touch /tmp/started && sleep infinity\n"
        "READY test -f /tmp/started\n"
    )
    built, logs = await api.wait("slowready", await api.build("slowready", recipe))
    assert built["status"] == "ready", (built, logs)
    headers = {**api.admin, "Idempotency-Key": "replay-1"}
    first = asyncio.create_task(
        api.http.post("/v1/sandboxes", json={"template": "slowready"}, headers=headers)
    )
    sandbox_id = None
    for _ in range(200):  # the replay is sent once the first create's record exists
        listed = await api.http.get("/v1/sandboxes", headers=api.admin)
        running = [
            s for s in listed.json()["sandboxes"] if s["template"] == "slowready" and s["state"] == "running"
        ]
        if running:
            sandbox_id = running[0]["id"]
            break
        await asyncio.sleep(0.05)
    assert sandbox_id is not None
    again = await api.http.post("/v1/sandboxes", json={"template": "slowready"}, headers=headers)
    assert again.status_code == 201 and again.headers["Idempotent-Replayed"] == "true", again.text
    assert again.json()["id"] == sandbox_id
    # Answered: so the ready check has passed.
    assert await api.run(sandbox_id, "ls /tmp/started") == "/tmp/started\n"
    answered = await first
    assert answered.status_code == 201 and answered.json()["id"] == sandbox_id, answered.text
    assert await api.run(sandbox_id, "cat /tmp/runs") == "run\n"
