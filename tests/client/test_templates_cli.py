"""``corral templates build|import|ls|rm`` and ``client.templates``, against a recorded contract: a build
is started (its context archive uploaded), its log followed until it ends; a failed build prints its
step and output and exits non-zero; ``ls --json`` prints the templates with their image, version and
size."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from corral.client import Corral
from corral.client.cli import EXIT_REFUSED, ClientFactory
from corral.client.templates_cli import EXIT_BUILD_FAILED, context_archive, templates_app

ARGS = ["--url", "http://corral.test", "--token", "t0k"]
BUILD_ID = "0f8fad5b-d9cb-469f-a165-70867728950e"
DIGEST = "sha256:" + "ab" * 32


def _build(status: str, logs: list[str], offset: int, **more: Any) -> dict[str, Any]:
    return {"id": BUILD_ID, "template": "web", "status": status, "logs": logs, "next_offset": offset, **more}


class Server:
    """web builds (after a context); broken fails at its step 3; templates lists one of each kind."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.context: bytes | None = None
        self.recipe: dict[str, Any] | None = None

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        self.seen.append((request.method, path))
        name = path.split("/")[3] if path.count("/") >= 3 else ""
        if request.method == "POST" and path.endswith("/builds"):
            self.recipe = json.loads(request.content)
            return httpx.Response(202, json=_build("waiting", ["--> building"], 1))
        if request.method == "PUT" and path.endswith("/context"):
            self.context = request.content
            return httpx.Response(202, json=_build("building", ["--> building"], 1))
        if request.method == "POST" and path.endswith("/imports"):
            self.context = request.content
            return httpx.Response(202, json=_build("building", ["--> importing"], 1))
        if request.method == "GET" and "/builds/" in path:
            offset = int(request.url.params["offset"])
            if name == "broken":
                failure = {
                    "reason": "failed",
                    "message": "step 3: RUN exit 3 exited 3",
                    "step": "step 3: RUN exit 3",
                    "line": 3,
                    "output": "the step's own words\n",
                }
                return httpx.Response(200, json=_build("error", ["--> step 3"], offset + 1, failure=failure))
            if offset < 2:
                return httpx.Response(200, json=_build("building", ["--> step 2 (cached)"], offset + 1))
            return httpx.Response(
                200, json=_build("ready", ["--> image"], offset + 1, digest=DIGEST, version=2)
            )
        if request.method == "GET" and path == "/v1/templates":
            templates = [
                {
                    "name": "default",
                    "cpus": 1,
                    "memory_mb": 512,
                    "stateful": False,
                    "description": "",
                    "pids": 256,
                },
                {
                    "name": "web",
                    "cpus": 1,
                    "memory_mb": 512,
                    "stateful": False,
                    "description": "",
                    "pids": 256,
                    "image": DIGEST,
                    "version": 2,
                    "size_bytes": 3 << 20,
                },
            ]
            return httpx.Response(200, json={"templates": templates})
        if request.method == "DELETE":
            if name == "nope":
                return httpx.Response(
                    404, json={"error": {"code": "not_found", "message": "no template 'nope'"}}
                )
            return httpx.Response(204)
        return httpx.Response(405)


def _invoke(server: Server, args: list[str]) -> Any:
    factory = ClientFactory(transport=httpx.MockTransport(server))
    return CliRunner().invoke(templates_app, [*args, *ARGS], obj=factory)


def test_build_uploads_its_context_and_follows_the_log_to_the_version(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "hello.txt").write_text("hi\n")
    (tmp_path / "ctx" / "out").symlink_to("/etc")  # archived as a link, never followed
    recipe = tmp_path / "Recipe"
    recipe.write_text("FROM debian:bookworm\nCOPY hello.txt /srv/\n")
    server = Server()
    result = _invoke(server, ["build", "web", "-f", str(recipe), str(tmp_path / "ctx")])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "--> building",
        "--> step 2 (cached)",
        "--> image",
        f"template web: version 2, image {DIGEST}",
    ]
    assert server.recipe == {"recipe": recipe.read_text(), "context": True}
    assert server.context is not None
    with tarfile.open(fileobj=io.BytesIO(server.context)) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert set(members) == {"hello.txt", "out"} and members["out"].issym()


def test_a_failed_build_prints_its_step_and_output_and_exits_non_zero(tmp_path: Path) -> None:
    recipe = tmp_path / "Recipe"
    recipe.write_text("FROM debian:bookworm\nRUN true\nRUN exit 3\n")
    result = _invoke(Server(), ["build", "broken", "-f", str(recipe)])
    assert result.exit_code == EXIT_BUILD_FAILED, result.output
    assert "error: the build failed at step 3: RUN exit 3: step 3: RUN exit 3 exited 3" in result.output
    assert "the step's own words" in result.output


def test_import_sends_the_archive_and_ls_json_shows_digest_version_and_size(tmp_path: Path) -> None:
    archive = tmp_path / "image.tar"
    archive.write_bytes(b"an archive's bytes")
    server = Server()
    result = _invoke(server, ["import", "web", str(archive), "--memory-mb", "256"])
    assert result.exit_code == 0, result.output
    assert server.context == b"an archive's bytes"
    assert ("POST", "/v1/templates/web/imports") in server.seen

    listed = _invoke(server, ["ls", "--json"])
    assert listed.exit_code == 0, listed.output
    got = {t["name"]: t for t in json.loads(listed.output)["templates"]}
    assert (got["web"]["image"], got["web"]["version"], got["web"]["size_bytes"]) == (DIGEST, 2, 3 << 20)
    assert got["default"]["image"] is None and got["default"]["version"] == 1
    table = _invoke(server, ["ls"])
    assert "3.0 MiB" in table.output and DIGEST in table.output


def test_rm_removes_and_a_refusal_exits_with_its_code() -> None:
    server = Server()
    assert _invoke(server, ["rm", "web"]).output == "template web removed\n"
    refused = _invoke(server, ["rm", "nope"])
    assert refused.exit_code == EXIT_REFUSED and "no template 'nope'" in refused.output


def test_the_client_builds_without_a_context_and_follows_to_the_end() -> None:
    server = Server()
    with Corral("http://corral.test", "t0k", transport=httpx.MockTransport(server)) as client:
        build = client.templates.build("web", "FROM debian:bookworm\n", memory_mb=256)
        items = list(client.templates.follow("web", build))
    assert server.recipe == {"recipe": "FROM debian:bookworm\n", "context": False, "memory_mb": 256}
    assert ("PUT", f"/v1/templates/web/builds/{BUILD_ID}/context") not in server.seen
    assert items[:-1] == ["--> building", "--> step 2 (cached)", "--> image"]
    assert items[-1].version == 2  # type: ignore[union-attr]


def test_the_context_archive_holds_the_directory_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    with tarfile.open(fileobj=io.BytesIO(context_archive(tmp_path / "a"))) as tar:
        assert sorted(tar.getnames()) == ["b", "b/f"]
