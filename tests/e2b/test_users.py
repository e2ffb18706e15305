"""The SDK's ``user=`` against a real ``corral serve``: in a sandbox of an image template, ``root`` runs
commands (and file calls, in an image with the python3 the file helper runs on) as root inside (an unprivileged uid on the host); a sandbox on the host's own
system has one user, and ``root`` there is refused with an error that says why."""

from __future__ import annotations

import asyncio

import pytest
from e2b import CommandExitException, Sandbox
from e2b.exceptions import SandboxException
from e2b.sandbox.commands.command_handle import PtySize

from corral.images import DirBlobStore, digest_file
from corral.store import TemplateRecord, open_store
from corral.testing.erofs import small_image
from tests.e2b.conftest import Corral
from tests.e2b.test_pty_watch import Screen

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]


async def _image_template(corral: Corral, name: str) -> None:
    """An image imported by the operator: its blob beside the server's store, its template in it."""
    image = small_image()
    digest = digest_file(image)
    await DirBlobStore(corral.workdir / "corral.blobs").put(digest, image)
    store = open_store(f"sqlite:///{corral.workdir / 'corral.db'}")
    try:
        if await store.get_template(name) is None:
            await store.create_template(TemplateRecord(name, 1.0, 256, image=digest, disk_mb=64))
    finally:
        await store.close()


def test_root_in_an_image_sandbox_and_a_clear_refusal_on_the_host_s_root(
    sdk_env: Corral, sandbox: Sandbox
) -> None:
    asyncio.run(_image_template(sdk_env, "debian-users"))
    # Written by another process into the server's SQLite file, read there on the next create.
    sb = Sandbox.create(template="debian-users")
    try:
        assert sb.commands.run("id -un").stdout == "user\n"
        assert sb.commands.run("id -u; echo $HOME", user="root").stdout == "0\n/root\n"
        sb.commands.run("echo made > /etc/made-by-root", user="root")
        assert sb.commands.run("stat -c %U /etc/made-by-root").stdout == "root\n"
        with pytest.raises(CommandExitException):
            sb.commands.run("echo no > /etc/made-by-user")  # the default user cannot write there
        assert sb.commands.run("sudo -n id -u").stdout == "0\n"
        # A terminal as either user: of the image's own devpts, owned by whoever it runs as.
        for who, uid in (("root", "0"), ("user", "1000")):
            handle = sb.pty.create(PtySize(rows=5, cols=40), user=who)  # type: ignore[arg-type]
            screen = Screen(handle)
            sb.pty.send_stdin(handle.pid, b"echo id=$(id -u) owner=$(stat -c %u $(tty)); exit\n")
            assert screen.shows(f"id={uid} owner={uid}"), screen.text()
            screen.thread.join(30)
    finally:
        sb.kill()

    with pytest.raises(SandboxException, match="runs only in a sandbox of an image template"):
        sandbox.commands.run("id -u", user="root")
    with pytest.raises(SandboxException, match="runs only in a sandbox of an image template"):
        sandbox.files.write("/tmp/x", "x", user="root")
    with pytest.raises(SandboxException, match="not 'nobody'"):
        sandbox.commands.run("id -u", user="nobody")
    assert sandbox.commands.run("id -un").stdout == "user\n"
