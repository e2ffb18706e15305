"""E2B's Template SDK build (``POST /v2/templates/{id}/builds/{buildID}``'s body) as the builder's own
recipe: its base mapped onto corral's bases, each instruction a recipe step (pure, no I/O).

E2B's rules, where they differ from a Dockerfile's: steps run as ``user`` in ``/home/user`` until
``USER``/``WORKDIR`` say otherwise, and the last of each is the sandbox's default; a step's own user
(``run_cmd(..., user="root")``, which ``apt_install`` and ``pip_install`` use) is that step's only;
``ENV`` holds for the build only (the SDK's own word); a ``COPY``'s files belong to its ``user``
argument, else the current user; ``force`` (``skip_cache``) rebuilds that step and all after it.

Bases: ``debian``/``debian:stable``/``debian:bookworm`` (``from_debian_image``) are corral's
``debian:bookworm``; ``python:3``/``python:3.11`` (``from_python_image``) and ``e2bdev/base``
(``from_base_image``, the SDK's default) are that base plus Debian's python 3.11 from its archive, a
first step that needs the build's network. Anything else names a registry image: refused.
"""

from __future__ import annotations

import posixpath
import re
import shlex
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from corral.control.errors import InvalidRequest, UnsupportedOption
from corral.images.bases import DEBIAN, PYTHON
from corral.images.config import DEFAULT_USER, DEFAULT_WORKDIR, USER_PATTERN, ImageConfig
from corral.images.recipe import MAX_STEPS, Recipe, Step, StepContext

DEBIAN_BASE = "debian:bookworm"
_DEBIAN = re.compile(r"^(docker\.io/(library/)?)?debian(:(stable|bookworm|12|latest)(-slim)?)?$")
_PYTHON = re.compile(r"^(docker\.io/(library/)?)?python(:3(\.11)?(-slim)?(-bookworm)?)?$")
_E2B_BASE = re.compile(r"^e2bdev/base(:latest)?$")
# What the python base adds to the Debian one: the python base's packages (corral.images.bases), and
# no "externally managed" marker, so `pip install` as root works as in the python images.
PYTHON_PACKAGES = tuple(p for p in PYTHON.packages if p not in DEBIAN.packages)
PYTHON_STEP = (
    "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
    + " ".join(PYTHON_PACKAGES)
    + " && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED && rm -rf /var/lib/apt/lists/*"
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER = re.compile(USER_PATTERN)
_OWNER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}(:([a-z_][a-z0-9_-]{0,31})?)?$")
_MODE = re.compile(r"^0?[0-7]{3,4}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")
_GLOB = re.compile(r"[*?\[]")
MAX_ARG_BYTES = 64 * 1024


class _Step(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str = Field(max_length=32)
    args: list[str] = Field(default_factory=list, max_length=256)
    files_hash: str | None = Field(default=None, alias="filesHash")
    force: bool = False


class _Start(BaseModel):
    """TemplateBuildStartV2."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    from_image: str | None = Field(default=None, alias="fromImage", max_length=512)
    from_template: str | None = Field(default=None, alias="fromTemplate", max_length=256)
    from_image_registry: dict[str, Any] | None = Field(default=None, alias="fromImageRegistry")
    force: bool = False
    steps: list[_Step] = Field(default_factory=list, max_length=MAX_STEPS)
    start_cmd: str | None = Field(default=None, alias="startCmd", max_length=MAX_ARG_BYTES)
    ready_cmd: str | None = Field(default=None, alias="readyCmd", max_length=MAX_ARG_BYTES)


@dataclass(frozen=True, slots=True)
class BuildPlan:
    """What a build does: its recipe (``recipe.base`` a corral base, or ``from_template``'s name when
    set), the uploads its COPY steps read (by hash), and whether its first step needs the network."""

    recipe: Recipe
    from_template: str | None = None
    hashes: tuple[str, ...] = ()
    python_base: bool = False


@dataclass
class _State:
    env: dict[str, str] = field(default_factory=dict)
    user: str = DEFAULT_USER
    workdir: str = DEFAULT_WORKDIR
    last_user: str | None = None
    last_workdir: str | None = None
    steps: list[Step] = field(default_factory=list)

    def context(self, user: str | None = None) -> StepContext:
        return StepContext(env=tuple(sorted(self.env.items())), user=user or self.user, workdir=self.workdir)

    def add(self, step: Step) -> None:
        if len(self.steps) >= MAX_STEPS:
            raise InvalidRequest("steps", f"a template has at most {MAX_STEPS} steps")
        self.steps.append(step)


def base_of(image: str) -> tuple[str, bool]:
    """The corral base an E2B ``fromImage`` names and whether python is added to it, or
    :class:`UnsupportedOption` (a registry image)."""
    if _DEBIAN.match(image):
        return DEBIAN_BASE, False
    if _PYTHON.match(image) or _E2B_BASE.match(image):
        return DEBIAN_BASE, True
    raise UnsupportedOption(
        "fromImage",
        f"{image[:120]!r} is a registry image, which this corral does not pull: build from "
        "from_debian_image() (Debian bookworm), from_python_image('3') or from_base_image() "
        "(bookworm's python 3.11), or from_template()",
    )


def _user(value: str, field_name: str) -> str:
    if not _USER.match(value):
        raise InvalidRequest(field_name, f"not a user name: {value[:40]!r}")
    return value


def _in_image(path: str, workdir: str, field_name: str) -> str:
    if not path or "\0" in path or len(path) > 4096:
        raise InvalidRequest(field_name, "a path in the template is empty or too long")
    normal = posixpath.normpath(posixpath.join(workdir, path))
    return normal + "/" if path.endswith("/") and normal != "/" else normal


def _source(src: str) -> str:
    normal = posixpath.normpath(src)
    if not src or src.startswith("/") or normal == ".." or normal.startswith("../") or "\0" in src:
        raise InvalidRequest("steps.args", f"a COPY source is a path inside the build context: {src[:80]!r}")
    if _GLOB.search(src):
        raise UnsupportedOption("steps.args", f"COPY sources with patterns are not supported: {src[:80]!r}")
    return normal


def _run(state: _State, line: int, step: _Step) -> None:
    if not step.args or not step.args[0].strip() or len(step.args) > 2:
        raise InvalidRequest("steps.args", f"step {line}: RUN takes a command and an optional user")
    command = step.args[0]
    if len(command.encode()) > MAX_ARG_BYTES:
        raise InvalidRequest("steps.args", f"step {line}: the command is longer than {MAX_ARG_BYTES} bytes")
    user = _user(step.args[1], "steps.args") if len(step.args) == 2 and step.args[1] else None
    state.add(Step(line, "run", f"RUN {command}", state.context(user), command=command))


def _copy(state: _State, line: int, step: _Step, hashes: list[str]) -> None:
    if len(step.args) < 2 or len(step.args) > 4:
        raise InvalidRequest("steps.args", f"step {line}: COPY takes a source, a destination, a user, a mode")
    if step.files_hash is None or not _HASH.match(step.files_hash):
        raise InvalidRequest("steps.filesHash", f"step {line}: COPY needs the hash of its uploaded files")
    src, dest = _source(step.args[0]), _in_image(step.args[1], state.workdir, "steps.args")
    owner = step.args[2] if len(step.args) > 2 and step.args[2] else state.user
    if not _OWNER.match(owner):
        raise InvalidRequest("steps.args", f"step {line}: not a user or user:group: {owner[:40]!r}")
    if ":" not in owner:
        owner += ":"  # chown's "user:": the user's own group too
    mode = step.args[3] if len(step.args) > 3 else ""
    if mode and not _MODE.match(mode):
        raise InvalidRequest("steps.args", f"step {line}: not an octal mode: {mode[:12]!r}")
    hashes.append(step.files_hash)
    text = f"COPY {step.args[0]} {step.args[1]}"
    # Copied as root (Docker's and E2B's rule), then owned by ``owner``.
    state.add(Step(line, "copy", text, state.context("root"), sources=(src,), dest=dest, owner=owner))
    if mode:
        target = dest + posixpath.basename(src) if dest.endswith("/") else dest
        chmod = f"chmod -R {mode} {shlex.quote(target)}"
        state.add(Step(line, "run", f"{text} (mode {mode})", state.context("root"), command=chmod))


def _env(state: _State, line: int, step: _Step) -> None:
    if not step.args or len(step.args) % 2:
        raise InvalidRequest("steps.args", f"step {line}: ENV takes names and values in pairs")
    for name, value in zip(step.args[::2], step.args[1::2], strict=True):
        if not _ENV_NAME.match(name) or "\0" in value:
            raise InvalidRequest("steps.args", f"step {line}: not an environment variable: {name[:80]!r}")
        state.env[name] = value


def _workdir(state: _State, line: int, step: _Step) -> None:
    if len(step.args) != 1:
        raise InvalidRequest("steps.args", f"step {line}: WORKDIR takes one path")
    state.workdir = state.last_workdir = (
        _in_image(step.args[0], state.workdir, "steps.args").rstrip("/") or "/"
    )
    state.add(Step(line, "workdir", f"WORKDIR {step.args[0]}", state.context(), dest=state.workdir))


def _set_user(state: _State, line: int, step: _Step) -> None:
    if len(step.args) != 1:
        raise InvalidRequest("steps.args", f"step {line}: USER takes one user")
    user = _user(step.args[0], "steps.args")
    if user != "root":  # E2B's USER makes the user when the image lacks it
        make = f"id -u {user} >/dev/null 2>&1 || useradd --create-home --shell /bin/bash {user}"
        state.add(Step(line, "run", f"USER {user}", state.context("root"), command=make))
    state.user = state.last_user = user


def _salt(state: _State, line: int) -> None:
    """A step no cache holds: every step after it is rebuilt (E2B's ``force``)."""
    nonce = uuid.uuid4().hex
    state.add(Step(line, "run", "skip the cache", state.context("root"), command=f": rebuild {nonce}"))


def from_template(body: dict[str, Any]) -> str | None:
    """The template ``body`` builds from, if it names one."""
    name = body.get("fromTemplate")
    return name if isinstance(name, str) and name else None


def plan(body: dict[str, Any], under: ImageConfig | None = None) -> BuildPlan:
    """The build ``body`` asks for, or :class:`InvalidRequest`/:class:`UnsupportedOption` naming the
    part that cannot be built here. ``under``: the config of the template it builds from (its steps
    start as that template's user, in its directory)."""
    try:
        start = _Start.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidRequest(".".join(map(str, first["loc"])) or "body", first["msg"]) from None
    if start.from_image_registry:
        raise UnsupportedOption(
            "fromImageRegistry", "private registries are not supported: images are not pulled"
        )
    if start.from_template and start.from_image:
        raise InvalidRequest("fromTemplate", "a template starts from an image or from a template, not both")
    state = _State()
    if under is not None and start.from_template:
        state.user, state.workdir = under.user, under.workdir
    python = False
    if start.from_template:
        base = start.from_template
    else:
        base, python = base_of(start.from_image or "e2bdev/base")
    if python:
        state.add(
            Step(
                0,
                "run",
                "FROM python (python3 from Debian's archive)",
                state.context("root"),
                command=PYTHON_STEP,
            )
        )
    if start.force:
        _salt(state, 0)
    hashes: list[str] = []
    forced = start.force
    for index, step in enumerate(start.steps):
        line = index + 1  # the SDK's step names: "base" for the base, then 1, 2... (its stack traces)
        if step.force and not forced:
            _salt(state, line)
            forced = True
        kind = step.type.upper()
        if kind == "RUN":
            _run(state, line, step)
        elif kind == "COPY":
            _copy(state, line, step, hashes)
        elif kind == "ENV":
            _env(state, line, step)
        elif kind == "WORKDIR":
            _workdir(state, line, step)
        elif kind == "USER":
            _set_user(state, line, step)
        else:
            raise UnsupportedOption("steps.type", f"step {line}: unknown step type {step.type[:32]!r}")
    recipe = Recipe(
        base=base,
        steps=tuple(state.steps),
        user=state.last_user,
        workdir=state.last_workdir,
        start_cmd=start.start_cmd or None,
        ready_cmd=start.ready_cmd or None,
    )
    return BuildPlan(recipe, start.from_template or None, tuple(dict.fromkeys(hashes)), python)
