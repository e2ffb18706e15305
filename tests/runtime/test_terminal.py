"""The runtime's terminals: a pty is taken only from a real devpts reached without following a link,
whatever a tenant made of the directories on the way."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from corral.runtime import terminal
from corral.runtime.stream import PtySize


def _dir(path: Path) -> int:
    return os.open(path, os.O_PATH | os.O_DIRECTORY)


def test_a_real_devpts_gives_a_sized_pair() -> None:
    root = _dir(Path("/"))
    try:
        master, slave = terminal.open_under(root)
    finally:
        os.close(root)
    try:
        terminal.resize(master, PtySize(rows=7, cols=9))
        assert os.get_terminal_size(slave) == os.terminal_size((9, 7))
        os.write(master, b"typed\n")
        assert os.read(slave, 100) == b"typed\n"
        assert terminal.session_of(master) is None  # nobody's controlling terminal yet
    finally:
        os.close(master)
        os.close(slave)


def test_links_and_lookalikes_on_the_way_are_refused(tmp_path: Path) -> None:
    # dev -> the host's /dev: a symlink on the way is not followed (nor resolved against the host).
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "dev").symlink_to("/dev")
    # dev/pts/ptmx a plain file, and a character device that is not devpts's ptmx.
    for name in ("plain", "null"):
        (tmp_path / name / "dev" / "pts").mkdir(parents=True)
    (tmp_path / "plain" / "dev" / "pts" / "ptmx").write_text("not a terminal")
    os.mknod(tmp_path / "null" / "dev" / "pts" / "ptmx", 0o666 | 0o020000, os.makedev(1, 3))
    # An absolute link inside resolves under the root, never the host's.
    escaping = tmp_path / "escaping" / "dev"
    escaping.mkdir(parents=True)
    (escaping / "pts").symlink_to("/dev/pts")
    for name, expected in (
        ("linked", errno.ELOOP),
        ("escaping", errno.ELOOP),
        ("plain", errno.ENOTTY),
        ("null", errno.ENOTTY),
    ):
        root = _dir(tmp_path / name)
        try:
            with pytest.raises(OSError) as refused:
                terminal.open_under(root)
        finally:
            os.close(root)
        assert refused.value.errno == expected, name


@pytest.mark.parametrize("size", [PtySize(0, 80), PtySize(24, 1 << 16), PtySize(True, 3), PtySize(-1, 3)])  # type: ignore[arg-type]
def test_sizes_out_of_range_are_refused(size: PtySize) -> None:
    with pytest.raises(ValueError, match="1 to 65535"):
        terminal.check_size(size)
