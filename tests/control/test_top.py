"""``corral top`` renders the dashboard's document: one frame, captured, with the fleet's numbers."""

from __future__ import annotations

import re

import httpx
import typer
from rich.console import Console
from typer.testing import CliRunner

from corral.client.cli import COMMANDS, ClientFactory
from corral.client.top import render

from .conftest import ADMIN, Cluster


def row_of(text: str, host: str) -> list[str]:
    for line in text.splitlines():
        cells = line.split()
        if cells and cells[0] == host:
            return cells
    raise AssertionError(f"no row for {host} in:\n{text}")


async def test_top_renders_one_frame_with_the_fleets_numbers(cluster: Cluster) -> None:
    for mb in (512, 1024, 2048, 512):
        r = await cluster.http.post("/v1/sandboxes", json={"memory_mb": mb}, headers=cluster.as_(ADMIN))
        assert r.status_code == 201
    await cluster.beat()
    doc = (await cluster.http.get("/dashboard/data.json", headers=cluster.as_(ADMIN))).json()
    api = (await cluster.http.get("/v1/hosts", headers=cluster.as_(ADMIN))).json()["hosts"]

    console = Console(record=True, width=200)
    console.print(render(doc))
    text = console.export_text()
    assert f"{len(api)} hosts, 4 sandboxes" in text
    assert f"replica {doc['requests']['replica']}" in text
    for h in api:
        cells = row_of(text, h["id"])
        # host, state, heartbeat age, sandboxes, placed 60s, admittable, reserved, resident, committed
        assert cells[1] == h["state"]
        assert cells[3] == str(h["sandboxes"])
        assert cells[5] == str(h["memory_mb_admittable"]) and cells[6] == str(h["reserved_mb"])
        assert cells[7] == str(h["memory_mb_used"])
    placed = {h["id"]: h["placements_60s"] for h in doc["hosts"]}
    assert sum(placed.values()) == 4
    assert all(row_of(text, host)[4] == str(n) for host, n in placed.items())

    # the command itself, --once, through the SDK (the document served as the API serves it)
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/dashboard/data.json"
        assert request.headers["authorization"] == "Bearer t0k"
        return httpx.Response(200, json=doc)

    app = typer.Typer()
    for name, command in COMMANDS.items():
        app.command(name)(command)
    result = CliRunner().invoke(
        app,
        ["top", "--once", "--url", "http://corral.test", "--token", "t0k"],
        obj=ClientFactory(transport=httpx.MockTransport(handler)),
        env={"COLUMNS": "100"},
    )
    assert result.exit_code == 0, result.output
    assert re.search(r"\b4 sandboxes\b", result.stdout)
    for h in api:
        assert row_of(result.stdout, h["id"])[3] == str(h["sandboxes"])
