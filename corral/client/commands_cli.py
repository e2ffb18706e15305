"""``corral logs``: a sandbox's background commands (``corral exec --detach ID -- CMD`` starts one).

``corral logs ID`` lists them; ``corral logs ID PID`` prints what its host kept of one's output
(stdout to stdout, stderr to stderr); with ``-f`` it follows it until it ends and exits with its exit
code. Interrupting a follow (Ctrl-C) only stops the following: the command runs on.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from corral.client.cli import (
    JsonOption,
    TokenOption,
    UrlOption,
    _exit_as,
    _print_json,
    _write,
    print_listing,
    server,
)
from corral.client.models import CommandInfo
from corral.exec_result import ExecResult, encode_event

COMMAND_COLUMNS = ("pid", "state", "exit", "started", "dropped", "command")


def _command_row(i: CommandInfo) -> tuple[str, ...]:
    return (
        str(i.pid),
        i.state + (" (timed out)" if i.timed_out else " (killed)" if i.killed else ""),
        "" if i.exit_code is None else str(i.exit_code),
        i.started_at.isoformat(timespec="seconds"),
        str(i.dropped_bytes) if i.dropped_bytes else "",
        " ".join(i.command),
    )


def logs_command(
    ctx: typer.Context,
    sandbox_id: Annotated[str, typer.Argument(metavar="ID", help="Sandbox id.")],
    pid: Annotated[
        int | None, typer.Argument(metavar="[PID]", min=1, help="A background command's pid.")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Follow its output until it ends; exit with its exit code.")
    ] = False,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """List a sandbox's background commands, or print one's output (-f: follow it until it ends)."""
    try:
        with server(ctx, url, token) as client:
            commands = client.sandboxes.commands(sandbox_id)
            if pid is None:
                infos = [h.info for h in commands.list()]
                title = f"{len(infos)} commands in {sandbox_id}"
                print_listing("commands", infos, _command_row, COMMAND_COLUMNS, as_json=as_json, title=title)
                return
            handle = commands.get(pid)
            if not follow:
                kept = handle.output()
                if as_json:
                    _print_json(kept.model_dump(mode="json"))
                    return
                _write(sys.stdout, kept.stdout)
                _write(sys.stderr, kept.stderr)
                if kept.command.dropped_bytes:
                    typer.echo(f"corral: {kept.command.dropped_bytes} earlier bytes were dropped", err=True)
                return
            result: ExecResult | None = None
            for event in handle.follow():
                if as_json:  # the API's own lines: one JSON object each
                    _write(sys.stdout, encode_event(event).decode())
                if isinstance(event, ExecResult):
                    result = event
                elif not as_json:
                    _write(sys.stdout if event.stream == "stdout" else sys.stderr, event.text)
    except KeyboardInterrupt:
        typer.echo("interrupted: the command runs on", err=True)
        raise typer.Exit(130) from None
    assert result is not None  # the follow raises when it ends without one
    if as_json:
        raise typer.Exit(result.exit_code)
    _exit_as(result)
