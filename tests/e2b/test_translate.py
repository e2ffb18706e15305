"""E2B's build body as the builder's recipe: the bases it maps, E2B's user/workdir/env rules, and what
it refuses (pure: no server, no build)."""

from __future__ import annotations

import json

import pytest
from e2b import Template, wait_for_port

from corral.api.e2b.translate import DEBIAN_BASE, PYTHON_STEP, base_of, plan
from corral.control.errors import InvalidRequest, UnsupportedOption
from corral.images.config import ImageConfig

H = "c" * 64


def _body(template: object) -> dict:  # type: ignore[type-arg]
    """What the SDK sends for ``template`` (files hashes replaced: no files exist here)."""
    inner = template._template  # type: ignore[attr-defined]
    return dict(json.loads(json.dumps(inner._serialize(inner._instructions), default=str)))


@pytest.mark.parametrize(
    ("image", "python"),
    [
        ("debian:stable", False),
        ("debian:bookworm-slim", False),
        ("python:3", True),
        ("python:3.11-slim", True),
        ("e2bdev/base", True),
    ],
)
def test_e2bs_bases_map_onto_corrals(image: str, python: bool) -> None:
    assert base_of(image) == (DEBIAN_BASE, python)


@pytest.mark.parametrize(
    "image",
    ["python:3.12", "ubuntu:22.04", "node:lts", "ghcr.io/x/y", "debian:trixie", "e2bdev/code-interpreter"],
)
def test_anything_else_is_a_registry_image_and_refused(image: str) -> None:
    with pytest.raises(UnsupportedOption, match="registry image"):
        base_of(image)


def test_the_sdks_steps_keep_e2bs_rules() -> None:
    t = (
        Template()
        .from_base_image()
        .apt_install(["tree", "jq"])
        .set_envs({"A": "1"})
        .run_cmd("echo $A")
        .set_user("guest")
        .set_workdir("app")
        .run_cmd("pwd")
        .set_start_cmd("python -m http.server 8000", wait_for_port(8000))
    )
    p = plan(_body(t))
    steps = p.recipe.steps
    assert p.python_base and steps[0].command == PYTHON_STEP and steps[0].line == 0
    apt, echo, make_user, workdir, pwd = steps[1:]
    assert (apt.line, apt.context.user, apt.context.workdir) == (1, "root", "/home/user")
    assert (echo.context.user, echo.context.env) == ("user", (("A", "1"),))
    assert make_user.context.user == "root" and "useradd" in make_user.command
    assert (workdir.kind, workdir.dest, pwd.context.user, pwd.context.workdir) == (
        "workdir",
        "/home/user/app",
        "guest",
        "/home/user/app",
    )
    config = p.recipe.config_over()
    assert config == ImageConfig(
        env={},
        user="guest",
        workdir="/home/user/app",
        start_cmd="python -m http.server 8000",
        ready_cmd=wait_for_port(8000).get_cmd(),
    )


def test_from_a_template_its_steps_start_as_its_user_in_its_directory() -> None:
    under = ImageConfig(user="guest", workdir="/srv")
    p = plan({"fromTemplate": "mine", "steps": [{"type": "RUN", "args": ["ls"]}]}, under)
    assert (p.from_template, p.recipe.base) == ("mine", "mine")
    assert (p.recipe.steps[0].context.user, p.recipe.steps[0].context.workdir) == ("guest", "/srv")
    assert p.recipe.config_over(under) == under


def test_copy_owns_its_files_and_sets_their_mode() -> None:
    steps = [{"type": "COPY", "args": ["app.py", "bin/", "", "0755"], "filesHash": H, "force": False}]
    p = plan({"fromImage": "debian", "steps": steps})
    copy, chmod = p.recipe.steps
    assert (copy.sources, copy.dest, copy.owner, copy.context.user) == (
        ("app.py",),
        "/home/user/bin/",
        "user:",
        "root",
    )
    assert chmod.command == "chmod -R 0755 /home/user/bin/app.py" and p.hashes == (H,)


def test_force_rebuilds_from_its_step_on() -> None:
    steps = [
        {"type": "RUN", "args": ["a"]},
        {"type": "RUN", "args": ["b"], "force": True},
        {"type": "RUN", "args": ["c"]},
    ]
    first, second = (plan({"fromImage": "debian", "steps": steps}) for _ in range(2))
    assert first.recipe.steps[0].command == "a"
    assert first.recipe.steps[1].command != second.recipe.steps[1].command  # a salt no cache holds
    assert [s.command for s in first.recipe.steps[2:]] == ["b", "c"]


@pytest.mark.parametrize(
    "body",
    [
        {
            "fromImage": "debian",
            "steps": [{"type": "COPY", "args": ["../../etc/shadow", "/x"], "filesHash": H}],
        },
        {"fromImage": "debian", "steps": [{"type": "COPY", "args": ["/etc/shadow", "/x"], "filesHash": H}]},
        {"fromImage": "debian", "steps": [{"type": "COPY", "args": ["a", "/x"], "filesHash": "../x"}]},
        {"fromImage": "debian", "steps": [{"type": "COPY", "args": ["a", "/x", "root;id"], "filesHash": H}]},
        {"fromImage": "debian", "steps": [{"type": "COPY", "args": ["a", "/x", "", "u+s"], "filesHash": H}]},
        {"fromImage": "debian", "steps": [{"type": "RUN", "args": ["id", "$(id)"]}]},
        {"fromImage": "debian", "steps": [{"type": "ENV", "args": ["BAD NAME", "x"]}]},
        {"fromImage": "debian", "steps": [{"type": "RUN", "args": ["x" * (64 * 1024 + 1)]}]},
        {"fromImage": "debian", "steps": [{"type": "RUN", "args": ["true"]}] * 201},
        {"fromImage": "debian", "fromTemplate": "t"},
        {"fromImage": 7},
    ],
)
def test_what_cannot_be_built_is_refused(body: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(InvalidRequest):
        plan(body)


@pytest.mark.parametrize(
    "body",
    [
        {"fromImage": "debian", "fromImageRegistry": {"type": "registry", "username": "u", "password": "p"}},
        {"fromImage": "debian", "steps": [{"type": "COPY", "args": ["*.py", "/x"], "filesHash": H}]},
        {"fromImage": "debian", "steps": [{"type": "FROM", "args": ["x"]}]},
    ],
)
def test_what_corral_does_not_do_is_refused_not_dropped(body: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(UnsupportedOption):
        plan(body)
