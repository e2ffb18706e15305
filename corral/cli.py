"""``corral ...``: the command line. Each sub-application lives beside what it starts."""

from __future__ import annotations

import typer

from corral import __version__
from corral.sim.cli import sim_app

app = typer.Typer(
    no_args_is_help=True, add_completion=False, help="corral: a control plane for sandbox fleets."
)


app.add_typer(sim_app, name="sim")


@app.callback()
def main() -> None:
    """corral: a control plane for sandbox fleets."""


@app.command()
def version() -> None:
    """Print corral's version."""
    typer.echo(__version__)


if __name__ == "__main__":  # pragma: no cover
    app()
