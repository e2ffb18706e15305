"""The builder on the small base: layers cached by (parent, step), the image's contents and owners,
a failing step, the time and disk limits, cancellation, and a step that tries to reach the host."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.images.builder import Builder, BuildFailed, BuildLimits
from corral.images.jail import BUILD_UID_BASE
from corral.images.recipe import parse


@contextlib.contextmanager
def mounted(image: Path, where: Path) -> Iterator[Path]:
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "erofs", "-o", "loop,ro", str(image), str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def _alive(marker: str) -> bool:
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return True
    return False


RECIPE = """\
FROM debian:bookworm
ENV GREETING=hello
RUN echo "$GREETING" > /greeting && echo built
USER user
WORKDIR /app
RUN id -u > /app/who && echo {last} > /app/last
CMD sleep infinity
"""


async def test_a_rebuild_with_its_last_step_changed_reruns_only_that_step(
    builder: Builder, tmp_path: Path
) -> None:
    logs: list[str] = []
    first = await builder.build(parse(RECIPE.format(last="one")), log=logs.append)
    assert any(line == "built" for line in logs)  # the step's own output, streamed
    second = await builder.build(parse(RECIPE.format(last="two")))
    assert second.steps_run == 1 and second.steps_cached == 3  # base, RUN, WORKDIR reused
    assert first.digest != second.digest
    assert await builder.blobs.has(first.digest) and await builder.blobs.has(second.digest)
    assert second.config.user == "user" and second.config.workdir == "/app"
    assert second.config.env == {"GREETING": "hello"} and second.config.start_cmd == "sleep infinity"
    again = await builder.build_layers(parse(RECIPE.format(last="two")))
    assert again.steps_run == 0 and again.top == second.top_layer
    image = builder.blobs.path(second.digest)  # type: ignore[attr-defined]
    with mounted(image, tmp_path / "m") as root:
        assert (root / "greeting").read_text() == "hello\n"
        assert (root / "app/last").read_text() == "two\n"
        assert (root / "app/who").read_text() == "1000\n"
        assert (root / "app/who").stat().st_uid == 1000  # the build's uids, not the host range
        sudo = (root / "usr/bin/sudo").stat()
        assert sudo.st_uid == 0 and sudo.st_mode & 0o4000
        assert (root / "etc/sudoers.d/user").read_text() == "user ALL=(ALL:ALL) NOPASSWD: ALL\n"
        assert (root / "home/user").stat().st_uid == 1000
        assert any(
            row.startswith("user:x:1000:1000:") for row in (root / "etc/passwd").read_text().splitlines()
        )
        for point in ("proc", "dev", "sys", "tmp"):
            assert (root / point).is_dir()
    # On the host, the layer's files belong to the build's unprivileged range, never to root.
    layer = builder.layers.path(second.top_layer)
    assert (layer / "app/last").stat().st_uid == BUILD_UID_BASE + 1000


async def test_a_failing_step_names_its_line_and_output(builder: Builder) -> None:
    with pytest.raises(BuildFailed) as caught:
        await builder.build_layers(parse("FROM debian:bookworm\nRUN true\nRUN echo went wrong >&2; exit 7\n"))
    failure = caught.value
    assert failure.reason == "failed" and failure.line == 3
    assert "exit 7" in failure.step and "exited 7" in failure.message
    assert "went wrong" in failure.output


async def test_the_time_limit_stops_a_step_and_everything_it_started(builder: Builder) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.25"
    recipe = parse(f"FROM debian:bookworm\nRUN sleep {marker} & sleep {marker}\n")
    await builder.build_layers(parse("FROM debian:bookworm\n"))  # the base, outside the limit
    with pytest.raises(BuildFailed) as caught:
        await builder.build_layers(recipe, limits=BuildLimits(timeout_s=2))
    assert caught.value.reason == "timeout" and caught.value.line == 2
    assert await _gone(marker)


async def test_a_cancelled_build_leaves_nothing_running(builder: Builder) -> None:
    marker = f"{uuid.uuid4().int % 10**6}.5"
    await builder.build_layers(parse("FROM debian:bookworm\n"))
    task = asyncio.create_task(builder.build_layers(parse(f"FROM debian:bookworm\nRUN sleep {marker}\n")))
    for _ in range(100):
        await asyncio.sleep(0.1)
        if _alive(marker):
            break
    assert _alive(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _gone(marker)


async def _gone(marker: str) -> bool:
    """Whether the step's processes are gone within a bound (a SIGKILLed tree is reaped a moment
    after the kill, later on a loaded machine)."""
    for _ in range(100):
        if not _alive(marker):
            return True
        await asyncio.sleep(0.1)
    return False


async def test_a_step_past_the_disk_limit_fails_with_enospc(builder: Builder) -> None:
    recipe = parse("FROM debian:bookworm\nRUN head -c 96M /dev/zero > /big\n")
    with pytest.raises(BuildFailed) as caught:
        await builder.build_layers(recipe, limits=BuildLimits(disk_mb=32))
    assert caught.value.reason == "failed"
    assert "No space left" in caught.value.output


async def test_a_step_sees_its_own_root_and_no_network(builder: Builder, tmp_path: Path) -> None:
    """Hostile steps: the host's files are not there, writes land in the layer only, the network is
    unshared, and root inside is the build's range outside."""
    host_secret = tmp_path / f"secret-{uuid.uuid4().hex}"
    host_secret.write_text("host")
    script = (
        f"test ! -e {host_secret}; "
        "test ! -e /root/.cache/corral-test; "
        "echo pwned > /etc/written-by-step; "
        "test -z \"$(grep -v '^ *lo:' /proc/net/dev | tail -n +3)\"; "
        "awk '{print $2}' /proc/self/uid_map > /uid-outside"
    )
    built = await builder.build_layers(parse(f"FROM debian:bookworm\nRUN {script}\n"))
    layer = builder.layers.path(built.top)
    assert (layer / "uid-outside").read_text().strip() == str(BUILD_UID_BASE)
    assert (layer / "etc/written-by-step").exists()
    assert not Path("/etc/written-by-step").exists()
    assert host_secret.read_text() == "host"


async def test_copy_takes_files_from_the_context_owned_as_asked(builder: Builder, tmp_path: Path) -> None:
    archive = tmp_path / "context.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in (("src/main.py", b"print('hi')\n"), ("README", b"read me\n")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("src/escape")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(link)
    context = await builder.stage_context(archive)
    recipe = parse("FROM debian:bookworm\nWORKDIR /app\nCOPY --chown=user:user src/ ./\nCOPY README /docs/\n")
    built = await builder.build_layers(recipe, context=context)
    chain = builder.layers.chain(built.top)
    copied = Path(chain[1])  # the first COPY's layer
    assert (copied / "app/main.py").read_text() == "print('hi')\n"
    assert (copied / "app/main.py").stat().st_uid == BUILD_UID_BASE + 1000
    assert os.readlink(copied / "app/escape") == "/etc/shadow"  # a link, copied as a link
    assert (Path(chain[0]) / "docs/README").read_text() == "read me\n"
    rebuilt = await builder.build_layers(recipe, context=context)
    assert rebuilt.steps_run == 0


async def test_a_context_of_several_gzipped_archives_is_staged_in_order(
    builder: Builder, tmp_path: Path
) -> None:
    """E2B's SDK uploads one gzip'd archive per COPY: all of them make one context, later ones over
    earlier ones (the extractor reads gzip from inside its chroot)."""
    archives = []
    for i, files in enumerate(({"a.txt": b"first\n", "b.txt": b"b\n"}, {"a.txt": b"second\n"})):
        archive = tmp_path / f"upload{i}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        archives.append(archive)
    context = await builder.stage_context(archives)
    try:
        assert (context / "a.txt").read_text() == "second\n" and (context / "b.txt").read_text() == "b\n"
    finally:
        shutil.rmtree(context)
