"""What ``pip install corral`` leaves out: the extras the server's and the simulator's commands need,
and the message that names the one to install."""

from __future__ import annotations

import importlib.util

import typer

EXTRAS = {
    "server": ("fastapi", "uvicorn", "psycopg", "psycopg_pool", "prometheus_client"),
    "sim": ("matplotlib",),
}


def missing_module(extra: str) -> str | None:
    """The first module of an extra that is not installed, if any."""
    return next((m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None), None)


def require_extra(extra: str, command: str) -> None:
    module = missing_module(extra)
    if module is not None:
        typer.echo(
            f"corral {command} needs the {extra} extra ({module} is not installed): "
            f"pip install 'corral[{extra}]'",
            err=True,
        )
        raise typer.Exit(2)
