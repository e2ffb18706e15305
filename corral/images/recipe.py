"""Recipes: the Dockerfile subset a template is built from, parsed into steps (pure, no I/O).

``FROM`` (first, once: a corral base such as ``debian:bookworm``, or an existing template's name),
``RUN`` (shell or JSON form), ``COPY [--chown=U[:G]] SRC... DEST`` (sources inside the build context),
``ENV K=V ...`` / ``ENV K V``, ``WORKDIR``, ``USER``, ``CMD`` (the start command), ``READY`` or
``HEALTHCHECK CMD`` (the ready command). ``LABEL``, ``EXPOSE``, ``ARG`` without a use and comments are
accepted and change nothing; anything else is refused with its line.

Steps run as root unless ``USER`` says otherwise (Docker's rule); the image's user is the last ``USER``,
else ``user`` (the sandbox's). Each filesystem step (RUN, COPY, WORKDIR) carries the environment, user
and directory it runs with, so its cache key changes when they do.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass

from corral.images.config import ImageConfig

MAX_RECIPE_BYTES = 256 * 1024
MAX_STEPS = 200
BUILD_USER = "root"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$|^[0-9]{1,5}$")
_IGNORED = {"LABEL", "EXPOSE", "ARG", "MAINTAINER", "STOPSIGNAL", "SHELL"}


class RecipeError(ValueError):
    """The recipe cannot be built: ``line`` (1-based, 0 for the whole recipe) and why."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
        self.message = message


@dataclass(frozen=True, slots=True)
class StepContext:
    """What a step runs with: the recipe's environment so far, its user and its directory."""

    env: tuple[tuple[str, str], ...]
    user: str
    workdir: str


@dataclass(frozen=True, slots=True)
class Step:
    """One filesystem step: ``kind`` is ``run`` (``command``), ``copy`` (``sources`` into ``dest``,
    owned by ``owner``) or ``workdir`` (``dest`` made and owned by the step's user)."""

    line: int
    kind: str
    text: str  # the recipe's own line, for logs and failures
    context: StepContext
    command: str = ""
    sources: tuple[str, ...] = ()
    dest: str = ""
    owner: str | None = None

    def key_text(self) -> str:
        """The canonical form the step's cache key is made from (the line's number excluded)."""
        return json.dumps(
            {
                "kind": self.kind,
                "command": self.command,
                "sources": list(self.sources),
                "dest": self.dest,
                "owner": self.owner,
                "env": [list(pair) for pair in self.context.env],
                "user": self.context.user,
                "workdir": self.context.workdir,
            },
            sort_keys=True,
        )


@dataclass(frozen=True, slots=True)
class Recipe:
    base: str
    steps: tuple[Step, ...]
    # What the recipe says of its image's config; None where it says nothing (the base's stands).
    env: tuple[tuple[str, str], ...] = ()
    user: str | None = None
    workdir: str | None = None
    start_cmd: str | None = None
    ready_cmd: str | None = None

    def config_over(self, base: ImageConfig | None = None) -> ImageConfig:
        """The image's config: the base's (a template's own, else the defaults) under the recipe's."""
        under = base or ImageConfig()
        return ImageConfig(
            env={**under.env, **dict(self.env)},
            user=self.user or under.user,
            workdir=self.workdir or under.workdir,
            start_cmd=self.start_cmd if self.start_cmd is not None else under.start_cmd,
            ready_cmd=self.ready_cmd if self.ready_cmd is not None else under.ready_cmd,
        )


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(line number, instruction) with continuations joined and comments dropped."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # Docker drops comment lines inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        lines.append((start, " ".join(p for p in pending if p)))
        pending = []
    if pending:
        lines.append((start, " ".join(p for p in pending if p)))
    return lines


def _command(line: int, argument: str) -> str:
    """A shell command from the shell form or the JSON (exec) form."""
    if argument.startswith("["):
        try:
            parts = json.loads(argument)
        except ValueError:
            raise RecipeError(line, "a JSON command must be a list of strings") from None
        if not isinstance(parts, list) or not parts or not all(isinstance(p, str) for p in parts):
            raise RecipeError(line, "a JSON command must be a non-empty list of strings")
        return shlex.join(parts)
    if not argument:
        raise RecipeError(line, "the command is empty")
    return argument


def _env_pairs(line: int, argument: str) -> list[tuple[str, str]]:
    try:
        words = shlex.split(argument)
    except ValueError as exc:
        raise RecipeError(line, f"ENV cannot be read: {exc}") from None
    if not words:
        raise RecipeError(line, "ENV names nothing")
    if "=" not in words[0]:
        name, _, value = argument.partition(" ")
        if not value.strip():
            raise RecipeError(line, f"ENV {name[:80]!r} has no value (ENV NAME=VALUE or ENV NAME VALUE)")
        pairs = [(name, value.strip())]
    else:
        pairs = []
        for word in words:
            name, sep, value = word.partition("=")
            if not sep:
                raise RecipeError(line, f"ENV expects NAME=VALUE, got {word[:80]!r}")
            pairs.append((name, value))
    for name, value in pairs:
        if not _ENV_NAME.match(name):
            raise RecipeError(line, f"not an environment variable name: {name[:80]!r}")
        if "\0" in value:
            raise RecipeError(line, "an environment value may not hold NUL")
    return pairs


def _path_in_image(line: int, path: str, workdir: str) -> str:
    if not path or "\0" in path:
        raise RecipeError(line, "a path is empty")
    return posixpath.normpath(posixpath.join(workdir, path))


def _context_source(line: int, source: str) -> str:
    """A COPY source: a path inside the build context (no absolute path, no climbing out)."""
    normal = posixpath.normpath(source)
    if source.startswith("/") or normal == ".." or normal.startswith("../") or "\0" in source:
        raise RecipeError(line, f"COPY sources are paths inside the build context: {source[:80]!r}")
    return normal


def _owner(line: int, value: str) -> str:
    user, _, group = value.partition(":")
    for name in (user, group) if group else (user,):
        if not _USER_NAME.match(name):
            raise RecipeError(line, f"not a user or group: {name[:40]!r}")
    return value


def parse(text: str) -> Recipe:
    """The recipe in ``text``, or RecipeError naming the first line that cannot be built."""
    if len(text.encode()) > MAX_RECIPE_BYTES:
        raise RecipeError(0, f"the recipe is larger than {MAX_RECIPE_BYTES} bytes")
    base: str | None = None
    env: dict[str, str] = {}
    user = BUILD_USER
    last_user: str | None = None
    workdir = "/"
    last_workdir: str | None = None
    start_cmd: str | None = None
    ready_cmd: str | None = None
    steps: list[Step] = []

    def context() -> StepContext:
        return StepContext(env=tuple(sorted(env.items())), user=user, workdir=workdir)

    for line, instruction in _logical_lines(text):
        keyword, _, argument = instruction.partition(" ")
        keyword, argument = keyword.upper(), argument.strip()
        if base is None and keyword != "FROM" and keyword not in _IGNORED:
            raise RecipeError(line, "a recipe starts with FROM")
        if keyword == "FROM":
            if base is not None:
                raise RecipeError(line, "one FROM per recipe (multi-stage builds are not supported)")
            words = argument.split()
            if len(words) != 1:
                raise RecipeError(line, "FROM names one base or template")
            base = words[0]
        elif keyword == "RUN":
            steps.append(Step(line, "run", instruction, context(), command=_command(line, argument)))
        elif keyword in ("COPY", "ADD"):
            if keyword == "ADD":
                raise RecipeError(line, "ADD is not supported: use COPY (and RUN to fetch or unpack)")
            words = argument.split()
            owner = None
            if words and words[0].startswith("--chown="):
                owner = _owner(line, words.pop(0).removeprefix("--chown="))
            if words and words[0].startswith("--"):
                raise RecipeError(line, f"COPY option not supported: {words[0][:40]!r}")
            if len(words) < 2:
                raise RecipeError(line, "COPY takes sources and a destination")
            sources = tuple(_context_source(line, s) for s in words[:-1])
            dest = _path_in_image(line, words[-1], workdir)
            if words[-1].endswith("/") and dest != "/":
                dest += "/"
            steps.append(Step(line, "copy", instruction, context(), sources=sources, dest=dest, owner=owner))
        elif keyword == "ENV":
            env.update(_env_pairs(line, argument))
        elif keyword == "WORKDIR":
            workdir = _path_in_image(line, argument, workdir)
            last_workdir = workdir
            steps.append(Step(line, "workdir", instruction, context(), dest=workdir))
        elif keyword == "USER":
            user = _owner(line, argument).partition(":")[0]
            last_user = user
        elif keyword == "CMD":
            start_cmd = _command(line, argument)
        elif keyword == "READY":
            ready_cmd = _command(line, argument)
        elif keyword == "HEALTHCHECK":
            words = argument.split(None, 1)
            if len(words) != 2 or words[0].upper() != "CMD":
                raise RecipeError(line, "HEALTHCHECK takes CMD and a command (no options)")
            ready_cmd = _command(line, words[1].strip())
        elif keyword == "ENTRYPOINT":
            raise RecipeError(line, "ENTRYPOINT is not supported: CMD is the start command")
        elif keyword in _IGNORED:
            continue
        else:
            raise RecipeError(line, f"unknown instruction {keyword[:40]!r}")
        if len(steps) > MAX_STEPS:
            raise RecipeError(line, f"a recipe has at most {MAX_STEPS} steps")
    if base is None:
        raise RecipeError(0, "a recipe needs FROM")
    return Recipe(
        base=base,
        steps=tuple(steps),
        env=tuple(sorted(env.items())),
        user=last_user,
        workdir=last_workdir,
        start_cmd=start_cmd,
        ready_cmd=ready_cmd,
    )
