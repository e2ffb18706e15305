"""``corral shell ID``: a shell in a sandbox, a line at a time.

Each line read (typed at the prompt, or piped in) runs as ``sh -c LINE`` in the sandbox through the
streamed exec route, its output printed as it is written; the working directory (``cd DIR``) and the
variables set with ``export NAME=VALUE`` carry over to the lines after it. Ctrl-C kills the running
command, not the shell; Ctrl-D or ``exit`` leaves it, with the last command's exit code.

There is no terminal (PTY) behind it, so programs that draw the screen (editors, ``top``) do not
work here; everything else a shell is used for does.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated

import typer

from corral.client.cli import JsonOption, TokenOption, UrlOption, _write, server
from corral.client.client import Corral
from corral.exec_result import MAX_EXEC_TIMEOUT_S

# ``cd`` with nothing after it goes home, as in sh; what it printed is where the shell now is.
_CD = 'cd -- "${1:-$HOME}" && pwd'


@dataclass
class ShellState:
    """What carries from one line to the next."""

    cwd: str | None = None  # None: the sandbox's own default (its user's home)
    env: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0


@dataclass(frozen=True)
class Line:
    """One line, as the shell runs it: a command, a change of directory, variables, or leaving."""

    kind: str  # "run", "cd", "export", "exit", "empty"
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    code: int | None = None


def parse_line(text: str) -> Line:
    """What ``text`` asks of the shell. Only a line that is nothing but ``cd [DIR]``, ``export
    NAME=VALUE...`` or ``exit [N]`` is the shell's own; any other line (``cd /tmp && ls`` included)
    runs as typed, in ``sh -c``."""
    stripped = text.strip()
    if not stripped or stripped.startswith("#"):
        return Line("empty")
    try:
        words = shlex.split(stripped)
    except ValueError:
        words = []  # unbalanced quotes: let sh say what is wrong with it
    if words and words[0] == "cd" and len(words) <= 2 and not _has_operators(stripped):
        return Line("cd", ["sh", "-c", _CD, "sh", *words[1:]])
    if words and words[0] == "exit" and len(words) <= 2 and not _has_operators(stripped):
        code = int(words[1]) if len(words) == 2 and words[1].isdigit() else None
        return Line("exit", code=code)
    if (
        len(words) > 1
        and words[0] == "export"
        and not _has_operators(stripped)
        and all(_assignment(w) for w in words[1:])
    ):
        return Line("export", env=dict(w.split("=", 1) for w in words[1:]))
    return Line("run", ["sh", "-c", stripped])


def _has_operators(text: str) -> bool:
    return any(op in text for op in (";", "&", "|", "$(", "`", ">", "<", "\n"))


def _assignment(word: str) -> bool:
    name, sep, _ = word.partition("=")
    return bool(sep) and name.isidentifier()


def run_line(
    client: Corral,
    sandbox_id: str,
    line: Line,
    state: ShellState,
    echo: Callable[[str], None],
) -> bool:
    """Run one line, updating ``state``; False when the shell should end."""
    if line.kind == "empty":
        return True
    if line.kind == "exit":
        if line.code is not None:
            state.exit_code = line.code
        return False
    if line.kind == "export":
        state.env.update(line.env)
        state.exit_code = 0
        return True
    if line.kind == "cd":
        result = client.sandboxes.exec(
            sandbox_id, line.argv, timeout_s=30, env=state.env or None, cwd=state.cwd
        )
        if result.exit_code == 0 and result.stdout.strip():
            state.cwd = result.stdout.strip().splitlines()[-1]
        elif result.stderr:
            echo(result.stderr)
        state.exit_code = result.exit_code
        return True
    try:
        result = client.sandboxes.exec(
            sandbox_id,
            line.argv,
            timeout_s=MAX_EXEC_TIMEOUT_S,
            env=state.env or None,
            cwd=state.cwd,
            on_stdout=lambda text: _write(sys.stdout, text),
            on_stderr=lambda text: _write(sys.stderr, text),
        )
    except KeyboardInterrupt:
        echo("^C (the command was killed)\n")
        state.exit_code = 130
        return True
    state.exit_code = result.exit_code
    if result.timed_out:
        echo("corral: the command timed out and was killed\n")
    elif result.note:
        echo(f"corral: {result.note}\n")
    return True


def echo(text: str) -> None:
    _write(sys.stderr, text)


def _prompt(sandbox_id: str, state: ShellState) -> str:
    return f"{sandbox_id}:{state.cwd or '~'}$ "


def shell_command(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """A shell in a sandbox, a line at a time: each line runs in `sh -c`, its output as it is written;
    `cd DIR` and `export NAME=VALUE` carry over. Ctrl-C kills the running command; Ctrl-D or `exit`
    leaves. No terminal behind it: programs that draw the screen do not work."""
    if as_json:
        raise typer.BadParameter("a shell has no JSON form: use `corral exec --json`", param_hint="--json")
    interactive = sys.stdin.isatty()
    state = ShellState()
    with server(ctx, url, token) as client:
        client.sandboxes.get(sandbox_id)  # an unknown id fails here, before any prompt
        if interactive:
            echo(f"corral shell in {sandbox_id}: a line at a time, no terminal; Ctrl-D leaves\n")
        while True:
            try:
                text = input(_prompt(sandbox_id, state)) if interactive else sys.stdin.readline()
            except EOFError:
                break
            except KeyboardInterrupt:
                echo("\n")
                continue
            if not interactive and not text:
                break
            if not run_line(client, sandbox_id, parse_line(text), state, echo):
                break
    if interactive:
        echo("\n")
    raise typer.Exit(state.exit_code)
