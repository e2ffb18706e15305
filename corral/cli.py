"""``corral ...``: the command line. Each sub-command lives beside what it starts; this module only
names them, and imports one only when it is run (or listed by ``--help``), so that ``corral version``
or ``corral ps`` does not pay for the server's and the simulator's imports."""

from __future__ import annotations

import importlib
from typing import Any

import typer
from typer import _click as click  # the click typer carries and builds its commands with
from typer.core import TyperGroup

from corral import __version__
from corral.extras import missing_module, require_extra

# name: (module, attribute, the extra it needs or None). A typer app is a group of commands; a
# function, one command.
COMMANDS: dict[str, tuple[str, str, str | None]] = {
    "serve": ("corral.api.cli", "serve", None),  # says itself which extra it lacks
    "api": ("corral.api.cli", "api", None),
    "kubeconfig": ("corral.api.cli", "kubeconfig", None),
    "admin": ("corral.api.cli", "admin_app", None),
    "agent": ("corral.agent.cli", "agent_command", "server"),
    "burst": ("corral.client.cli", "burst_command", None),
    "ps": ("corral.client.cli", "ps_command", None),
    "hosts": ("corral.client.cli", "hosts_command", None),
    "tokens": ("corral.client.cli", "tokens_command", None),
    "exec": ("corral.client.cli", "exec_command", None),
    "logs": ("corral.client.commands_cli", "logs_command", None),
    "create": ("corral.client.cli", "create_command", None),
    "kill": ("corral.client.cli", "kill_command", None),
    "rm": ("corral.client.cli", "kill_command", None),
    "shell": ("corral.client.shell_cli", "shell_command", None),
    "explain": ("corral.client.cli", "explain_command", None),
    "top": ("corral.client.cli", "top_command", None),
    "dashboard": ("corral.client.cli", "dashboard_command", None),
    "pools": ("corral.client.pools_cli", "pools_app", None),
    "tenants": ("corral.client.tenants_cli", "tenants_app", None),
    "templates": ("corral.client.templates_cli", "templates_app", None),
    "sim": ("corral.sim.cli", "sim_app", "sim"),
}
# Commands that pass what follows them on untouched (``exec ID -- CMD ARGS``).
PASS_THROUGH = {"allow_extra_args": True, "ignore_unknown_options": True}


class _Lazy(TyperGroup):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in COMMANDS if n not in self.commands)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = super().get_command(ctx, cmd_name)
        if found is None and cmd_name in COMMANDS:
            found = load(cmd_name)
            found.name = cmd_name
            self.add_command(found, cmd_name)
        return found


def load(name: str) -> click.Command:
    module, attribute, extra = COMMANDS[name]
    if extra is not None and missing_module(extra) is not None:
        return _needs_extra(extra, name)
    obj: Any = getattr(importlib.import_module(module), attribute)
    if isinstance(obj, typer.Typer):
        return typer.main.get_group(obj)  # a group, even of one command (``admin reseal``)
    one = typer.Typer(add_completion=False)
    one.command(name, context_settings=PASS_THROUGH if name == "exec" else None)(obj)
    return typer.main.get_command(one)


def _needs_extra(extra: str, command: str) -> click.Command:
    """A stub that explains which extra to install."""
    one = typer.Typer(add_completion=False)

    @one.command(
        command,
        help=f"(needs `pip install 'corral[{extra}]'`)",
        context_settings=PASS_THROUGH,
        add_help_option=False,
    )
    def stub(ctx: typer.Context) -> None:
        require_extra(extra, command)

    return typer.main.get_command(one)


app = typer.Typer(
    cls=_Lazy, no_args_is_help=True, add_completion=False, help="corral: a control plane for sandbox fleets."
)


@app.callback()
def main() -> None:
    """corral: a control plane for sandbox fleets."""


@app.command()
def version() -> None:
    """Print corral's version."""
    typer.echo(__version__)


if __name__ == "__main__":  # pragma: no cover
    app()
