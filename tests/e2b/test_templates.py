"""E2B's Template SDK, unmodified, against a real ``corral serve``: a template built from the Debian base
with apt, a COPY, the build-only environment, a user and a directory, then started with
``Sandbox.create(name)``; a second template built from the first. And what a hostile tenant tries: a
registry image, another tenant's builds, uploads and templates, paths that climb out.

The server's build steps share this machine's network (``--build-network``, for apt): the risk that
flag names is the operator's choice, documented in docs/e2b.md.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_file
from e2b.exceptions import BuildException

from corral.control.builds import unavailable_reason
from corral.testing.images import small_base
from tests.ci import require
from tests.e2b.conftest import Corral

pytestmark = pytest.mark.timeout(300)


def _image_config(corral: Corral, name: str) -> dict:  # type: ignore[type-arg]
    with sqlite3.connect(corral.workdir / "corral.db") as db:
        row = db.execute("SELECT image, image_config FROM templates WHERE name = ?", (name,)).fetchone()
    assert row is not None and row[0].startswith("sha256:"), row
    return dict(json.loads(row[1]))


def _require_builds() -> None:
    """Builds need root and the image tools (``make system-deps``, which CI runs)."""
    require(unavailable_reason())


def test_a_template_built_with_the_sdk_starts_sandboxes(sdk_env: Corral, tmp_path: Path) -> None:
    _require_builds()
    small_base()  # the server's bases directory is the test cache: the small base made once
    (tmp_path / "hello.txt").write_text("copied in\n")
    name = f"e2e-{time.monotonic_ns()}"
    template = (
        Template(file_context_path=str(tmp_path))
        .from_debian_image()
        .apt_install("tree", no_install_recommends=True)
        .run_cmd("rm -rf /var/lib/apt/lists/*", user="root")  # not in the image: it is packed flat
        .set_envs({"GREETING": "from the build"})
        .run_cmd("echo $GREETING > ~/greeting; whoami >> ~/greeting")
        .copy("hello.txt", "/home/user/app/")
        .set_workdir("/home/user/app")
        .set_start_cmd("touch /tmp/started && sleep infinity", wait_for_file("/tmp/started"))
    )
    logs: list[str] = []
    info = Template.build(template, alias=name, on_build_logs=lambda e: logs.append(e.message))
    assert info.name == name
    assert any("apt-get" in line for line in logs) and any("image sha256:" in line for line in logs), logs

    config = _image_config(sdk_env, f"{sdk_env.alice_id}.{name}")
    assert config["start_cmd"] == "touch /tmp/started && sleep infinity"
    assert config["ready_cmd"] == "[ -f /tmp/started ]"
    assert (config["user"], config["workdir"]) == ("user", "/home/user/app")
    assert config["env"] == {}  # set_envs holds for the build only (the SDK's word)

    sb = Sandbox.create(name)
    try:
        r = sb.commands.run(
            "tree --version; cat ~/greeting; cat hello.txt; ls -l hello.txt; pwd; echo ${GREETING:-unset}"
        )
        # Ready once its ready check passed: its start command ran (and runs on) before the create answered.
        assert sb.commands.run("ls /tmp/started").stdout.strip() == "/tmp/started"
        lines = r.stdout.splitlines()
        assert lines[0].startswith("tree v"), r.stdout
        assert lines[1:4] == ["from the build", "user", "copied in"], r.stdout
        assert " user user " in lines[4], r.stdout  # COPY's files belong to the current user
        assert lines[5:] == ["/home/user/app", "unset"], r.stdout
    finally:
        sb.kill()

    # From the template just built: its layers are reused, one step runs.
    child = f"{name}-child"
    built = Template().from_template(name).run_cmd("echo child > ~/child")
    logs.clear()
    Template.build(built, alias=child, on_build_logs=lambda e: logs.append(e.message))
    assert not any("apt-get" in line for line in logs), logs
    sb = Sandbox.create(child)
    try:
        assert sb.commands.run("cat ~/child; cat ~/greeting; pwd").stdout.split() == [
            "child",
            "from",
            "the",
            "build",
            "user",
            "/home/user/app",
        ]
    finally:
        sb.kill()

    # Another tenant sees none of it: not by its name, not by its namespaced name, not as a base.
    other = {"X-API-KEY": sdk_env.other_key}
    with httpx.Client(base_url=sdk_env.url, headers=other) as bob:
        for template_id in (name, f"{sdk_env.alice_id}.{name}"):
            r = bob.post("/sandboxes", json={"templateID": template_id})
            assert r.status_code == 422 and "unknown template" in r.json()["message"], r.text
        assert bob.get(f"/templates/aliases/{name}").status_code == 404
        bob_build = bob.post("/v3/templates", json={"name": "stolen"}).json()
        start = {"fromTemplate": f"{sdk_env.alice_id}.{name}", "steps": []}
        r = bob.post(f"/v2/templates/stolen/builds/{bob_build['buildID']}", json=start)
        assert r.status_code == 422 and "unknown template" in r.json()["message"], r.text


def test_a_registry_image_is_refused_in_e2bs_shape(sdk_env: Corral) -> None:
    with pytest.raises(BuildException, match="registry image"):
        Template.build(Template().from_image("ghcr.io/someone/image:1"), alias="registry")
    with httpx.Client(base_url=sdk_env.url, headers={"X-API-KEY": sdk_env.key}) as alice:
        build = alice.post("/v3/templates", json={"name": "registry"}).json()
        r = alice.post(f"/v2/templates/registry/builds/{build['buildID']}", json={"fromImage": "node:20"})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == 400 and r.json()["error_code"] == "unsupported_option", r.text


def test_a_failing_step_is_named_with_its_output(sdk_env: Corral) -> None:
    _require_builds()
    small_base()
    template = Template().from_debian_image().run_cmd("echo fine").run_cmd("echo broken >&2; exit 3")
    with pytest.raises(BuildException, match="exited 3"):
        Template.build(template, alias=f"failing-{time.monotonic_ns()}")


def test_builds_and_uploads_are_the_tenants_own(sdk_env: Corral) -> None:
    h = "a" * 64
    with (
        httpx.Client(base_url=sdk_env.url, headers={"X-API-KEY": sdk_env.key}) as alice,
        httpx.Client(base_url=sdk_env.url, headers={"X-API-KEY": sdk_env.other_key}) as bob,
    ):
        build = alice.post("/v3/templates", json={"name": "mine"})
        assert build.status_code == 202, build.text
        build_id = build.json()["buildID"]
        link = alice.get(f"/templates/mine/files/{h}")
        assert link.status_code == 201 and link.json()["present"] is False, link.text
        assert link.json()["url"].endswith(f"/templates/mine/files/{h}")
        # Bob can neither poll, start, nor upload into Alice's build, nor learn what she uploaded.
        assert bob.get(f"/templates/mine/builds/{build_id}/status").status_code == 404
        assert bob.post(f"/v2/templates/mine/builds/{build_id}", json={"steps": []}).status_code == 404
        assert bob.get(f"/templates/mine/files/{h}").status_code == 404
        assert bob.put(f"/templates/mine/files/{h}", content=b"x").status_code == 404
        assert alice.put(f"/templates/mine/files/{h}", content=b"not a tar").status_code == 200
        assert alice.get(f"/templates/mine/files/{h}").json() == {"present": True}
        bob.post("/v3/templates", json={"name": "mine"})
        assert bob.get(f"/templates/mine/files/{h}").json()["present"] is False
        # Paths that climb out, names that are not names, steps the builder cannot take: 4xx.
        assert alice.get("/templates/mine/files/..%2F..%2Fetc").status_code in (404, 422)
        assert alice.get("/templates/mine/files/not-a-hash").status_code == 422
        assert alice.put("/templates/mine/files/..%2F..%2Fetc", content=b"x").status_code in (404, 422)
        for body in ({"name": "../up"}, {"name": "x" * 200}, {"name": "t:v1"}, {"name": "t", "memoryMB": -1}):
            r = alice.post("/v3/templates", json=body)
            assert 400 <= r.status_code < 500, (body, r.text)
        climbing = {"type": "COPY", "args": ["../../etc/shadow", "/tmp/"], "filesHash": h}
        for steps in (
            [climbing],
            [{"type": "COPY", "args": ["a", "/tmp/"], "filesHash": "b" * 64}],  # never uploaded
            [{"type": "RUN", "args": ["true", "root; rm -rf /"]}],
            [{"type": "USER", "args": ["$(id)"]}],
            [{"type": "ENV", "args": ["A B", "1"]}],
            [{"type": "FROM", "args": ["x"]}],
        ):
            r = alice.post(
                f"/v2/templates/mine/builds/{build_id}", json={"fromImage": "debian", "steps": steps}
            )
            assert 400 <= r.status_code < 500, (steps, r.text)
        status = alice.get(f"/templates/mine/builds/{build_id}/status").json()
        assert status["status"] == "waiting", status
