"""Every client command a script may call answers in JSON with ``--json``: a structural check over the
CLI's own command table (a command added without it fails here), and the answers of those that print
one line otherwise."""

from __future__ import annotations

import json

import httpx
import typer
from typer import _click as click
from typer.testing import CliRunner

from corral import cli
from corral.client.cli import ClientFactory

from .fakes import FakeApi

# The server side (its own flags), the simulator, and what has no answer to give as data: a shell is
# a conversation, a version one word.
NOT_DATA = {"serve", "api", "agent", "kubeconfig", "admin", "sim", "shell"}
ARGS = ["--url", "http://corral.test", "--token", "t0k"]


def _leaves(command: click.Command, name: str) -> list[tuple[str, click.Command]]:
    subcommands = getattr(command, "commands", None)  # a group's
    if subcommands:
        return [leaf for sub, c in subcommands.items() for leaf in _leaves(c, f"{name} {sub}")]
    return [(name, command)]


def test_every_client_command_takes_json() -> None:
    missing = []
    for name in cli.COMMANDS:
        if name in NOT_DATA:
            continue
        for full, command in _leaves(cli.load(name), name):
            if not any("--json" in p.opts for p in command.params):
                missing.append(full)
    assert missing == []


def test_rm_answers_in_json_gone_or_already_gone() -> None:
    api = FakeApi()
    factory = ClientFactory(transport=api.transport)
    api.handle(
        httpx.Request(
            "POST",
            "http://corral.test/v1/sandboxes",
            headers={"Authorization": "Bearer t0k"},
            json={"template": "t"},
        )
    )
    app: typer.Typer = cli.app
    runner = CliRunner()
    done = runner.invoke(app, ["rm", "sb-1", *ARGS, "--json"], obj=factory)
    assert done.exit_code == 0 and json.loads(done.stdout) == {"id": "sb-1", "deleted": True}
    again = runner.invoke(app, ["rm", "sb-1", *ARGS, "--json", "--missing-ok"], obj=factory)
    assert again.exit_code == 0 and json.loads(again.stdout) == {"id": "sb-1", "deleted": False}
    refused = runner.invoke(app, ["rm", "sb-1", *ARGS, "--json"], obj=factory)
    assert refused.exit_code == 1 and "not_found" in refused.stderr
