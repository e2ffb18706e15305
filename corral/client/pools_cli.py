"""``corral pools create|ls|rm``: warm pools from the command line (admin token)."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.client.cli import JsonOption, TokenOption, UrlOption, _print_json, print_listing, server
from corral.client.pools import Pool

pools_app = typer.Typer(help="Warm pools: sandboxes booted ahead of the creates that take them.")


@pools_app.command("create")
def create_command(
    ctx: typer.Context,
    template: Annotated[str, typer.Argument(help="Template the pool keeps warm.")],
    size: Annotated[int, typer.Option("--size", min=0, help="Warm sandboxes over the fleet.")],
    max_per_host: Annotated[int | None, typer.Option("--max-per-host", min=1)] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Create a pool, or resize it if the template has one."""
    with server(ctx, url, token) as client:
        existing = {p.template for p in client.pools.list()}
        if template in existing:
            pool = client.pools.resize(template, size)
        else:
            pool = client.pools.create(template, size, max_per_host=max_per_host)
    if as_json:
        _print_json(pool.model_dump(mode="json"))
        return
    typer.echo(f"pool {pool.template}: size {pool.size}, {pool.ready} ready")


@pools_app.command("ls")
def ls_command(
    ctx: typer.Context, url: UrlOption = None, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """List pools with their fill and hits."""
    with server(ctx, url, token) as client:
        pools = client.pools.list()

    def row(p: Pool) -> tuple[str, ...]:
        hosts = sum(1 for h in p.per_host.values() if h.target)
        return (
            p.template,
            str(p.size),
            str(p.ready),
            str(p.starting),
            str(hosts),
            str(p.hits),
            str(p.misses),
        )

    columns = ("template", "size", "ready", "starting", "hosts", "hits", "misses")
    print_listing("pools", pools, row, columns, as_json=as_json, left={"template"})


@pools_app.command("rm")
def rm_command(
    ctx: typer.Context,
    template: Annotated[str, typer.Argument(help="Template whose pool goes.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Delete a pool: its unclaimed warm sandboxes stop; claimed ones stay."""
    with server(ctx, url, token) as client:
        client.pools.delete(template)
    if as_json:
        _print_json({"template": template, "deleted": True})
        return
    typer.echo(f"pool {template} deleted")
