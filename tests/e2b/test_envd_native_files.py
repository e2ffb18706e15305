"""The data plane's file operations served by the sandbox's own launcher (its ``fs`` mode), with real
sandboxes: an image whose root has no python3 has files all the same, names that are not text travel
and come back, and what a tenant makes too big (a listing, a sparse file) ends at the agent's bound."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import httpx
import pytest

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.envd import Envd
from corral.agent.envd.files import MAX_ANSWER_BYTES
from corral.agent.protocol import StartSandbox
from corral.runtime import bwrap
from corral.runtime.base import GuestFiles, Runtime
from corral.runtime.cgroups import CgroupRoot
from corral.runtime.guestfs import GuestFs
from corral.runtime.gvisor import GvisorRuntime
from corral.runtime.launcher import FS_PROTOCOL
from corral.testing.resolver import DictResolver
from tests.runtime.conftest import RuntimeFactory, cgroup_root, eventually, make_process_runtime  # noqa: F401
from tests.runtime.images import Image, base_image, image_runtime

pytestmark = pytest.mark.process

SID = "native-files"
CREATE = "EVENT_TYPE_CREATE"
LIMIT = 64 * 1024


@pytest.fixture(scope="session")
def image() -> Image:
    return base_image()


EVERY_RUNTIME = pytest.mark.parametrize("sandbox", ["host", "image", "gvisor", "gvisor-image"], indirect=True)


@pytest.fixture(params=["host", "image"])
async def sandbox(
    request: pytest.FixtureRequest,
    make_process_runtime: RuntimeFactory,  # noqa: F811
    cgroup_root: CgroupRoot,  # noqa: F811
    tmp_path: Path,
    image: Image,
) -> AsyncIterator[tuple[Runtime, httpx.AsyncClient]]:
    """A sandbox on the host's own system, of the small Debian image (which has no python3), or,
    where a test asks, behind gVisor (on the host's system or that image)."""
    runtime: Runtime
    if request.param == "image":
        runtime = image_runtime(make_process_runtime, tmp_path, DictResolver({image.digest: image.path}))
    elif request.param in ("gvisor", "gvisor-image"):
        images = DictResolver({image.digest: image.path}) if request.param == "gvisor-image" else None
        runtime = GvisorRuntime(
            tmp_path / "gvisor", cgroup_root=cgroup_root, images=images, disk_root=tmp_path / "gvisor-disks"
        )
    else:
        runtime = make_process_runtime()
    agent = Agent(
        AgentConfig("host-1", 4096, 2.0, address="http://127.0.0.1:1"), runtime, pressure=lambda: 0.0
    )
    of_image = {"image": image.digest, "disk_mb": 64} if request.param.endswith("image") else {}
    await agent.start(StartSandbox(id=SID, memory_mb=256, **of_image))  # type: ignore[arg-type]
    app = Envd(agent, files_max_bytes=LIMIT, idle_timeout_s=5.0)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app), base_url="http://envd", headers={"E2b-Sandbox-Id": SID}
    ) as client:
        yield runtime, client
    await agent.stop(SID)
    if isinstance(runtime, GvisorRuntime):
        await runtime.drain_disks()


async def sh(runtime: Runtime, script: str) -> str:
    r = await runtime.exec(SID, ["sh", "-c", script])
    assert r.exit_code == 0, r.stderr
    return r.stdout


async def rpc(envd: httpx.AsyncClient, method: str, body: dict[str, object]) -> httpx.Response:
    # As JSON in ASCII, as the answers are: a surrogate-escaped name is then sent back unchanged.
    return await envd.post(
        f"/filesystem.Filesystem/{method}",
        content=json.dumps(body),
        headers={"Content-Type": "application/json"},
    )


@EVERY_RUNTIME
async def test_every_operation_works_without_python3(
    sandbox: tuple[Runtime, httpx.AsyncClient],
) -> None:
    runtime, envd = sandbox
    assert isinstance(runtime, GuestFiles)
    assert await runtime.guest_program(SID) in (bwrap.INIT_PATH, bwrap.IMAGE_INIT_PATH)
    if await runtime.guest_program(SID) == bwrap.IMAGE_INIT_PATH:
        r = await runtime.exec(SID, ["sh", "-c", "command -v python3"])
        assert r.exit_code != 0, "the image was meant to have no python3"
    # Under /tmp: gVisor's home is not the user's to write here (the helper fares no better).
    r = await envd.post("/files", params={"path": "/tmp/notes/a.txt"}, files={"file": ("a.txt", b"hello")})
    assert r.status_code == 200, r.text
    assert r.json() == [{"name": "a.txt", "type": "file", "path": "/tmp/notes/a.txt"}]
    assert (await envd.get("/files", params={"path": "~/../../tmp/notes/a.txt"})).content == b"hello"
    assert (await rpc(envd, "Stat", {"path": "~"})).json()["entry"]["path"] == "/home/user"
    stat = await rpc(envd, "Stat", {"path": "/tmp/notes/a.txt"})
    assert stat.status_code == 200 and stat.json()["entry"]["size"] == "5"
    assert stat.json()["entry"]["owner"] == "user"
    r = await rpc(envd, "MakeDir", {"path": "/tmp/d/e"})
    assert r.status_code == 200 and r.json()["entry"]["type"] == "FILE_TYPE_DIRECTORY"
    assert (await rpc(envd, "MakeDir", {"path": "/tmp/d/e"})).json()["code"] == "already_exists"
    r = await rpc(envd, "Move", {"source": "/tmp/notes/a.txt", "destination": "/tmp/d/e/b.txt"})
    assert r.status_code == 200 and r.json()["entry"]["path"] == "/tmp/d/e/b.txt"
    r = await rpc(envd, "ListDir", {"path": "/tmp/d", "depth": 2})
    assert [e["path"] for e in r.json()["entries"]] == ["/tmp/d/e", "/tmp/d/e/b.txt"]
    assert (await rpc(envd, "Remove", {"path": "/tmp/d"})).json() == {}
    assert (await rpc(envd, "Stat", {"path": "/tmp/d"})).json()["code"] == "not_found"
    assert (await envd.get("/files", params={"path": "/tmp/d/e/b.txt"})).status_code == 404
    assert await sh(runtime, "test ! -e /tmp/d && test ! -e /tmp/notes/a.txt && echo gone") == "gone\n"


@EVERY_RUNTIME
async def test_names_that_are_not_text_travel_and_come_back(
    sandbox: tuple[Runtime, httpx.AsyncClient],
) -> None:
    runtime, envd = sandbox
    await sh(
        runtime,
        "mkdir /tmp/w && cd /tmp/w && printf 1 > \"$(printf 'bad\\377')\" && printf 2 > 'q\"uote\\' "
        "&& printf 3 > \"$(printf 'new\\nline')\" && ln -s loop loop",
    )
    r = await rpc(envd, "ListDir", {"path": "/tmp/w"})
    assert r.status_code == 200, r.text
    assert r.content.isascii()
    entries = {e["name"]: e for e in r.json()["entries"]}
    assert set(entries) == {"bad\udcff", 'q"uote\\', "new\nline", "loop"}
    assert entries["loop"]["type"] == "FILE_TYPE_UNSPECIFIED" and entries["loop"]["isSymlink"]
    for name, entry in entries.items():
        again = await rpc(envd, "Stat", {"path": entry["path"]})
        assert again.json() == {"entry": entry}, name
    r = await envd.get("/files", params={"path": "/tmp/w/new\nline"})
    assert r.content == b"3"


async def test_a_listing_past_the_answer_s_bound_is_refused(
    sandbox: tuple[Runtime, httpx.AsyncClient],
) -> None:
    runtime, envd = sandbox
    # 100,000 entries (on a tmpfs: the image disk has too few inodes), some 230 bytes each answered:
    # far past the answer's bound.
    await sh(runtime, "mkdir /dev/shm/many && cd /dev/shm/many && seq 100000 | xargs touch")
    r = await rpc(envd, "ListDir", {"path": "/dev/shm/many"})
    assert r.status_code == 429 and r.json() == {
        "code": "resource_exhausted",
        "message": f"the answer is larger than {MAX_ANSWER_BYTES} bytes",
    }
    # The sandbox's command slots are all free again: nothing of the listing is left running.
    assert (await rpc(envd, "Stat", {"path": "/dev/shm/many/1"})).status_code == 200


async def test_a_huge_sparse_file_is_cut_at_the_download_bound(
    sandbox: tuple[Runtime, httpx.AsyncClient],
) -> None:
    runtime, envd = sandbox
    await sh(runtime, "truncate -s 1T ~/sparse")
    got = bytearray()
    with pytest.raises(RuntimeError, match=f"larger than {LIMIT} bytes"):
        async with envd.stream("GET", "/files", params={"path": "~/sparse"}) as r:
            assert r.status_code == 200
            async for chunk in r.aiter_bytes():
                got += chunk
    assert len(got) <= LIMIT and not any(got)


async def test_a_path_too_long_for_the_command_line_is_refused(
    sandbox: tuple[Runtime, httpx.AsyncClient],
) -> None:
    _, envd = sandbox
    r = await rpc(envd, "Stat", {"path": "/" + "x" * 40_000})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = await rpc(envd, "Stat", {"path": "/tmp/" + "x" * 5000})
    assert r.status_code == 400 and "File name too long" in r.json()["message"]
    r = await rpc(envd, "ListDir", {"path": "/tmp", "depth": "deep"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    r = await rpc(envd, "Stat", {"path": "/tmp/\ud800"})
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"


@EVERY_RUNTIME
async def test_a_launcher_that_does_not_serve_the_fs_mode_leaves_files_to_the_helper(
    sandbox: tuple[Runtime, httpx.AsyncClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, envd = sandbox
    assert isinstance(runtime, GuestFiles)
    inside = await runtime.guest_program(SID)
    assert inside is not None
    probe = GuestFs()
    # Anything but the launcher's own answer to `fs version` (an older init, adopted after an
    # upgrade, says "unknown mode") is no fs mode; a sandbox's next incarnation is asked again.
    assert await probe.program(runtime, SID, "/bin/echo", "first") is None
    assert await probe.program(runtime, SID, inside, "first") is None  # remembered for this one
    assert await probe.program(runtime, SID, inside, "second") == inside
    r = await runtime.exec(SID, [inside, "fs", "version"])
    assert r.stdout == FS_PROTOCOL + "\n"

    async def none(sandbox_id: str) -> str | None:
        return None

    monkeypatch.setattr(runtime, "guest_program", none)
    r = await rpc(envd, "Stat", {"path": "/tmp"})
    if inside == bwrap.INIT_PATH:
        assert r.status_code == 200 and r.json()["entry"]["path"] == "/tmp"  # the helper, under python3
    else:
        # No python3 in the image: a refusal saying so, not a server error.
        assert r.status_code == 400 and r.json()["code"] == "failed_precondition", r.text
        assert "python3" in r.json()["message"]


@EVERY_RUNTIME
async def test_a_recursive_watch_works_without_python3(
    sandbox: tuple[Runtime, httpx.AsyncClient],
    eventually: Callable[..., Awaitable[bool]],  # noqa: F811
) -> None:
    runtime, envd = sandbox
    await sh(runtime, "mkdir -p /tmp/watched/old")
    r = await rpc(envd, "CreateWatcher", {"path": "/tmp/watched", "recursive": True})
    assert r.status_code == 200, r.text
    watcher = {"watcherId": r.json()["watcherId"]}
    seen: set[tuple[str, str]] = set()

    def saw(*events: tuple[str, str]) -> Callable[[], Awaitable[bool]]:
        async def probe() -> bool:
            r = await rpc(envd, "GetWatcherEvents", watcher)
            seen.update((e["name"], e["type"]) for e in r.json()["events"])
            return set(events) <= seen

        return probe

    await sh(
        runtime, "mkdir /tmp/watched/new && touch /tmp/watched/old/a \"/tmp/watched/$(printf 'b\\377')\""
    )
    assert await eventually(saw(("new", CREATE), ("old/a", CREATE), ("b\udcff", CREATE))), seen
    # new/ is watched before its creation is told: what is made in it now is seen too.
    await sh(runtime, "touch /tmp/watched/new/c")
    assert await eventually(saw(("new/c", CREATE))), seen
    assert (await rpc(envd, "RemoveWatcher", watcher)).status_code == 200
