"""A hostile tenant against the agent's data plane, with real sandboxes: paths that try to leave the
sandbox, another user, uploads too big or too slow, oversized messages. Each file operation runs in
the sandbox as its user, so the worst a path can name is the sandbox's own file."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.envd import Envd
from corral.agent.envd.connect import envelope
from corral.agent.protocol import StartSandbox
from corral.runtime.process import ProcessRuntime
from tests.runtime.conftest import cgroup_root, make_process_runtime, process_runtime  # noqa: F401

pytestmark = pytest.mark.process

SID = "hostile"
LIMIT = 64 * 1024


@pytest.fixture
async def app(process_runtime: ProcessRuntime) -> AsyncIterator[Envd]:  # noqa: F811
    agent = Agent(
        AgentConfig("host-1", 4096, 2.0, address="http://127.0.0.1:1"), process_runtime, pressure=lambda: 0.0
    )
    await agent.start(StartSandbox(id=SID, memory_mb=256))
    yield Envd(agent, files_max_bytes=LIMIT, idle_timeout_s=0.5)
    if SID in agent.sandbox_ids():
        await agent.stop(SID)


@pytest.fixture
async def envd(app: Envd) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://envd", headers={"E2b-Sandbox-Id": SID}
    ) as client:
        yield client


async def run(process_runtime: ProcessRuntime, script: str) -> str:  # noqa: F811
    r = await process_runtime.exec(SID, ["sh", "-c", script])
    assert r.exit_code == 0, r.stderr
    return r.stdout


async def test_paths_cannot_leave_the_sandbox(
    envd: httpx.AsyncClient,
    process_runtime: ProcessRuntime,  # noqa: F811
    tmp_path: Path,
) -> None:
    secret = tmp_path / "host-secret"
    secret.write_text("host only")
    # Upward traversal from home ends at the sandbox's root, and writes land in the sandbox.
    escape = f"../../../..{tmp_path}/escaped"
    r = await envd.post("/files", params={"path": escape}, files={"file": ("x", b"boo")})
    assert r.status_code == 200, r.text
    assert not (tmp_path / "escaped").exists()
    assert await run(process_runtime, f"cat {tmp_path}/escaped") == "boo"  # inside the sandbox's /tmp
    # The host's file is not there to read, by path, by traversal or through a symlink.
    for path in (str(secret), f"../../..{secret}"):
        assert (await envd.get("/files", params={"path": path})).status_code == 404
    await run(process_runtime, f"ln -s {secret} /home/user/link; ln -s /proc/1/root/etc /home/user/etc")
    assert (await envd.get("/files", params={"path": "/home/user/link"})).status_code == 404
    # /proc/1 is the sandbox's init, which no tenant process may look into (it is not dumpable).
    r = await envd.get("/files", params={"path": "/home/user/etc/passwd"})
    assert r.status_code == 403 and "host only" not in r.text
    # A write through a symlink replaces the link, not its target.
    await run(process_runtime, "ln -s /usr/bin/env /home/user/tool")
    r = await envd.post(
        "/files",
        params={"path": "/home/user/tool"},
        content=b"x",
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 200
    assert Path("/usr/bin/env").read_bytes()[:4] == b"\x7fELF"
    # Files the sandbox user may not touch stay untouched.
    r = await envd.post("/filesystem.Filesystem/Remove", json={"path": "/usr/bin/env"})
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    assert Path("/usr/bin/env").exists()


async def test_only_the_sandbox_user(envd: httpx.AsyncClient) -> None:
    r = await envd.get("/files", params={"path": "/etc/hostname", "username": "root"})
    assert r.status_code == 403
    root = "Basic " + base64.b64encode(b"root:").decode()
    r = await envd.post("/filesystem.Filesystem/Stat", json={"path": "/"}, headers={"Authorization": root})
    assert r.status_code == 403 and r.json()["code"] == "permission_denied"
    start = envelope({"process": {"cmd": "id"}})
    r = await envd.post(
        "/process.Process/Start",
        content=start,
        headers={"Authorization": root, "Content-Type": "application/connect+json"},
    )
    assert json.loads(r.content[5:])["error"]["code"] == "permission_denied"


async def test_uploads_too_big_or_too_slow_leave_nothing(
    envd: httpx.AsyncClient,
    process_runtime: ProcessRuntime,  # noqa: F811
) -> None:
    big = b"x" * (LIMIT + 1)
    for kwargs in (
        {"content": big, "headers": {"Content-Type": "application/octet-stream"}},
        {"files": {"file": ("big", big)}},
    ):
        r = await envd.post("/files", params={"path": "/tmp/big"}, **kwargs)  # type: ignore[arg-type]
        assert r.status_code == 413, r.text

    async def stalls() -> AsyncIterator[bytes]:
        yield b"first part"
        await asyncio.sleep(3)
        yield b"never"

    r = await envd.post(
        "/files",
        params={"path": "/tmp/slow"},
        content=stalls(),
        headers={"Content-Type": "application/octet-stream"},
    )
    assert r.status_code == 408
    assert await run(process_runtime, "ls -A /tmp") == ""  # no file, no partial


async def test_oversized_messages_are_refused(envd: httpx.AsyncClient) -> None:
    r = await envd.post("/filesystem.Filesystem/Stat", content=b'{"path": "' + b"a" * (2 << 20) + b'"}')
    assert r.status_code == 429 and r.json()["code"] == "resource_exhausted"
    r = await envd.post("/filesystem.Filesystem/Stat", content=b"[1]")
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    assert (await envd.get("/health", headers={"E2b-Sandbox-Id": "nope"})).status_code == 502


async def test_a_large_listing_is_whole(envd: httpx.AsyncClient, process_runtime: ProcessRuntime) -> None:  # noqa: F811
    # Far more than one pipe's worth of answer.
    await run(
        process_runtime,
        "mkdir -p /tmp/many && cd /tmp/many && for i in $(seq 1 600); do : > file-with-a-long-name-$i; done",
    )
    r = await envd.post("/filesystem.Filesystem/ListDir", json={"path": "/tmp/many", "depth": 1})
    assert r.status_code == 200, r.text
    assert len(r.json()["entries"]) == 600
