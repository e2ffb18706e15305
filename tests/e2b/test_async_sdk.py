"""The SDK's ``AsyncSandbox`` against the same ``corral serve``: the calls of the sync tests, through
the other half of the SDK (its own clients and paginator), and what ``get_info`` says beside what the
create said."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from e2b import AsyncSandbox, CommandExitException, FileType, SandboxQuery, SandboxState
from e2b.exceptions import SandboxException

from tests.e2b.conftest import Corral

pytestmark = pytest.mark.timeout(120)


async def test_the_async_sandbox_end_to_end(sdk_env: Corral) -> None:
    tag = f"async-{asyncio.get_running_loop().time()}"
    sb = await AsyncSandbox.create(metadata={"tag": tag}, timeout=120, envs={"GREETING": "hello"})
    try:
        info = await sb.get_info()
        # What get_info says agrees with the create's answer and with itself.
        assert (info.sandbox_id, info.sandbox_domain, info.envd_version) == (
            sb.sandbox_id,
            sb.sandbox_domain,
            "0.5.7",
        )
        # Its end is its start plus its timeout (the two read from one clock, microseconds apart).
        lasts = info.end_at - info.started_at
        assert abs(lasts - datetime.timedelta(seconds=120)) < datetime.timedelta(seconds=1)
        assert info.state is SandboxState.RUNNING and info.metadata == {"tag": tag}

        assert (await sb.commands.run("echo $GREETING")).stdout == "hello\n"
        with pytest.raises(CommandExitException) as failed:
            await sb.commands.run("exit 3")
        assert failed.value.exit_code == 3
        chunks: list[str] = []
        handle = await sb.commands.run("cat", background=True, on_stdout=chunks.append, stdin=True)
        await sb.commands.send_stdin(handle.pid, "piped\n")
        await sb.commands.close_stdin(handle.pid)
        assert (await handle.wait()).stdout == "piped\n" and "".join(chunks) == "piped\n"
        sleeper = await sb.commands.run("sleep 60", background=True)
        assert [p.pid for p in await sb.commands.list()] == [sleeper.pid]
        assert await sb.commands.kill(sleeper.pid)
        with pytest.raises(CommandExitException):
            await sleeper.wait()

        await sb.files.make_dir("/tmp/a/b")
        await sb.files.write("/tmp/a/b/f", b"bytes")
        await sb.files.write_files([{"path": "/tmp/a/g", "data": "text"}])
        assert await sb.files.read("/tmp/a/b/f", format="bytes") == b"bytes"
        assert await sb.files.read("/tmp/a/b/f", gzip=True) == "bytes"  # asked gzip, answered plain
        assert b"".join([c async for c in await sb.files.read("/tmp/a/b/f", format="stream")]) == b"bytes"
        deep = {e.path for e in await sb.files.list("/tmp/a", depth=2)}
        assert deep == {"/tmp/a/b", "/tmp/a/b/f", "/tmp/a/g"}
        assert {e.name: e.type for e in await sb.files.list("/tmp/a")} == {
            "b": FileType.DIR,
            "g": FileType.FILE,
        }
        await sb.files.rename("/tmp/a/g", "/tmp/a/h")
        assert (await sb.files.get_info("/tmp/a/h")).size == 4
        await sb.files.remove("/tmp/a/h")
        assert not await sb.files.exists("/tmp/a/h")

        assert (await sb.get_metrics())[-1].mem_used > 0
        listed = await AsyncSandbox.list(query=SandboxQuery(metadata={"tag": tag})).next_items()
        assert [s.sandbox_id for s in listed] == [sb.sandbox_id]

        await sb.set_timeout(300)
        assert await sb.pause()
        assert not await sb.is_running()
        back = await AsyncSandbox.connect(sb.sandbox_id, timeout=60)
        assert await back.is_running() and await back.files.read("/tmp/a/b/f") == "bytes"
        with pytest.raises(SandboxException, match="not supported by corral"):
            await back.fork()
    finally:
        assert await AsyncSandbox.kill(sb.sandbox_id)
    assert not await AsyncSandbox.kill(sb.sandbox_id)  # already gone: False, as E2B answers
