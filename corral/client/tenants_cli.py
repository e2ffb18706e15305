"""``corral tenants create|ls|e2b-key|rm``: tenants from the command line (admin token), each named by its
name, as every tenants route takes it."""

from __future__ import annotations

from typing import Annotated

import typer

from corral.client.cli import JsonOption, TokenOption, UrlOption, _print_json, print_listing, server
from corral.client.models import Tenant

tenants_app = typer.Typer(help="Tenants: who may create sandboxes, their limits and their keys.")


@tenants_app.command("create")
def create_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    max_sandboxes: Annotated[int | None, typer.Option("--max-sandboxes", min=0)] = None,
    max_memory_mb: Annotated[int | None, typer.Option("--max-memory-mb", min=0)] = None,
    max_cpus: Annotated[float | None, typer.Option("--max-cpus", min=0)] = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="Accepted for scripts that pass it everywhere: the answer is JSON.")
    ] = True,
) -> None:
    """Create a tenant; print it as JSON, with its first token (`token`, shown this once: it is also
    the tenant's E2B API key)."""
    with server(ctx, url, token) as client:
        tenant = client.tenants.create(
            name, max_sandboxes=max_sandboxes, max_memory_mb=max_memory_mb, max_cpus=max_cpus
        )
    _print_json(tenant.model_dump(mode="json"))


@tenants_app.command("ls")
def ls_command(
    ctx: typer.Context, url: UrlOption = None, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """List tenants with their limits."""
    with server(ctx, url, token) as client:
        tenants = client.tenants.list()

    def row(t: Tenant) -> tuple[str, ...]:
        return (t.name, t.id, str(t.max_sandboxes), str(t.max_memory_mb), f"{t.max_cpus:g}")

    columns = ("name", "id", "max sandboxes", "max memory MiB", "max cpus")
    print_listing("tenants", tenants, row, columns, as_json=as_json, no_wrap=True)


@tenants_app.command("e2b-key")
def e2b_key_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Issue the tenant a key in the `e2b_...` form (for E2B_API_KEY); print it."""
    with server(ctx, url, token) as client:
        key = client.tenants.e2b_key(name)
    if as_json:
        _print_json(key.model_dump(mode="json"))
    else:
        typer.echo(key.key)


@tenants_app.command("rm")
def rm_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The tenant's name.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove a tenant and revoke its tokens and E2B keys. Refused while any of its sandboxes is live:
    delete them first (`corral ps`, `corral rm ID`)."""
    with server(ctx, url, token) as client:
        client.tenants.delete(name)
    if as_json:
        _print_json({"name": name, "removed": True})
    else:
        typer.echo(f"removed tenant {name}; its tokens and E2B keys are revoked")
