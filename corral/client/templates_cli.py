"""``corral templates build|import|ls|rm``: templates and their images from the command line. Building
and importing take an admin token; listing any token.

``build`` and ``import`` follow the build's log as it comes, and exit non-zero (EXIT_BUILD_FAILED)
with the failing step and its output when it fails; Ctrl-C cancels the build on the server."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import Annotated

import typer

from corral.client import Corral
from corral.client.cli import JsonOption, TokenOption, UrlOption, _print_json, print_listing, server
from corral.client.templates import Build, Template

templates_app = typer.Typer(help="Templates: images built from a recipe or imported, with their versions.")

EXIT_BUILD_FAILED = 1

CpusOption = Annotated[float | None, typer.Option("--cpus", min=0.001, help="CPUs of its sandboxes.")]
MemoryOption = Annotated[int | None, typer.Option("--memory-mb", min=1, help="Memory of its sandboxes.")]
DiskOption = Annotated[int | None, typer.Option("--disk-mb", min=1, help="Its sandboxes' own disk.")]


def context_archive(directory: Path) -> bytes:
    """The build context: ``directory``'s files as a tar archive, paths relative to it (a symlink is
    archived as a link, never followed out of the directory)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for top, dirs, files in os.walk(directory, followlinks=False):
            dirs.sort()
            for entry in [*dirs, *sorted(files)]:
                path = Path(top) / entry
                tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()


def _follow(client: Corral, name: str, build: Build, as_json: bool) -> None:
    """Print the build's log until it ends; a failure ends the command with its step and output."""
    ended = build
    try:
        for item in client.templates.follow(name, build):
            if isinstance(item, Build):
                ended = item
            elif not as_json:
                typer.echo(item)
    except KeyboardInterrupt:
        ended = client.templates.cancel(name, build.id)
        typer.echo(f"build {build.id} cancelled", err=True)
    if as_json:
        _print_json(ended.model_dump(mode="json"))
    failure = ended.failure
    if ended.status == "ready" and failure is None:
        if not as_json:
            typer.echo(f"template {name}: version {ended.version}, image {ended.digest}")
        return
    if failure is not None:
        where = f" at {failure.step}" if failure.step else ""
        typer.echo(f"error: the build failed{where}: {failure.message}", err=True)
        if failure.output.strip():
            typer.echo(failure.output.rstrip(), err=True)
    raise typer.Exit(EXIT_BUILD_FAILED)


@templates_app.command("build")
def build_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The template (built as its next version).")],
    recipe: Annotated[
        Path,
        typer.Option("-f", "--file", exists=True, dir_okay=False, help="The recipe (a Dockerfile subset)."),
    ],
    context: Annotated[
        Path | None,
        typer.Argument(exists=True, file_okay=False, help="The build context: the files COPY names."),
    ] = None,
    cpus: CpusOption = None,
    memory_mb: MemoryOption = None,
    disk_mb: DiskOption = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Build a template from a recipe, following its log."""
    text = recipe.read_text()
    archive = context_archive(context) if context is not None else None
    with server(ctx, url, token) as client:
        build = client.templates.build(
            name, text, context=archive, cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb
        )
        _follow(client, name, build, as_json)


@templates_app.command("import")
def import_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The template (imported as its next version).")],
    archive: Annotated[
        Path,
        typer.Argument(
            exists=True,
            dir_okay=False,
            help="An OCI image layout, a `docker save` archive or a rootfs tarball.",
        ),
    ],
    cpus: CpusOption = None,
    memory_mb: MemoryOption = None,
    disk_mb: DiskOption = None,
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Import an image archive as a template, following the import's log."""
    data = archive.read_bytes()
    with server(ctx, url, token) as client:
        build = client.templates.import_image(name, data, cpus=cpus, memory_mb=memory_mb, disk_mb=disk_mb)
        _follow(client, name, build, as_json)


def _size(n: int | None) -> str:
    return "-" if n is None else f"{n / (1 << 20):.1f} MiB"


@templates_app.command("ls")
def ls_command(
    ctx: typer.Context, url: UrlOption = None, token: TokenOption = None, as_json: JsonOption = False
) -> None:
    """List templates with their image digest, version and size."""
    with server(ctx, url, token) as client:
        templates = client.templates.list()

    def row(t: Template) -> tuple[str, ...]:
        disk = "-" if t.disk_mb is None else str(t.disk_mb)
        image = t.image or "(host root)"
        return (t.name, str(t.version), image, _size(t.size_bytes), f"{t.cpus:g}", str(t.memory_mb), disk)

    columns = ("name", "version", "image", "size", "cpus", "memory_mb", "disk_mb")
    print_listing("templates", templates, row, columns, as_json=as_json, left={"name", "image"})


@templates_app.command("rm")
def rm_command(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The template to remove.")],
    url: UrlOption = None,
    token: TokenOption = None,
    as_json: JsonOption = False,
) -> None:
    """Remove a template: its running sandboxes keep their image (collected once none is left)."""
    with server(ctx, url, token) as client:
        client.templates.delete(name)
    if as_json:
        _print_json({"template": name, "deleted": True})
        return
    typer.echo(f"template {name} removed")
