"""The launcher's ``fs`` mode, run directly on the host: the same answers as the Python helper it
replaces (corral/agent/envd/helper.py) for the same requests, and a defensive C path against names
that are not text, paths too long or looping, a directory too big to answer, a file too big to read
and an upload cut short."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.agent.envd.fscommand import native_command
from corral.agent.envd.helper import __file__ as helper_file
from corral.runtime import launcher

HELPER = Path(helper_file).read_text()
LIMIT = 16 * 1024 * 1024
ODD_NAMES = [
    b"new\nline",
    b'quo"te',
    b"back\\slash",
    b"ctl\x01\x1f",
    b"bad\xffbyte",
    b"surrogate\xed\xa0\x80",
    b"overlong\xc0\xaf",
    b"cut\xe2\x82",
    "é€😀".encode(),
    b" spaces: ",
]


def answer(argv: list[str], home: Path, stdin: bytes = b"") -> tuple[int, Any, Any]:
    done = subprocess.run(argv, input=stdin, capture_output=True, env={"HOME": str(home), "PATH": os.defpath})
    out: Any = done.stdout
    if out[:1] != b"\0" and out:
        out = json.loads(out)
    return done.returncode, out, json.loads(done.stderr) if done.stderr else None


def argvs(request: dict[str, Any], limit: int = LIMIT) -> list[list[str]]:
    """The helper's command for ``request``, and the launcher's."""
    return [
        [sys.executable, "-I", "-c", HELPER, json.dumps(request)],
        native_command(str(launcher.path()), request, limit),
    ]


def native(request: dict[str, Any], home: Path, limit: int = LIMIT) -> tuple[int, Any, Any]:
    return answer(argvs(request, limit)[1], home)


def on_fresh_trees(tmp_path: Path, request: dict[str, Any], target: Path | None = None) -> list[Any]:
    """Each side's answer, and what it left, on a fresh tree of its own."""
    home = tmp_path / "home"
    seen = []
    for argv in argvs(request):
        tree(tmp_path)
        answered = without_times(answer(argv, home, b"data" * 1000))
        left = [listing(home), listing(target) if target is not None else None]
        if target is not None and target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target is not None and os.path.lexists(target):
            target.unlink()
        seen.append((answered, left))
    return seen


def listing(root: Path) -> list[bytes] | bool:
    if not root.is_dir() or root.is_symlink():
        return os.path.lexists(root)
    found = []
    for top, dirs, files in os.walk(os.fsencode(root)):
        found += [os.path.join(top, name) for name in dirs + files]
    return sorted(found)


def tree(root: Path) -> Path:
    """A home with files, directories, odd names and symlinks of every kind, at fixed times."""
    if root.exists():
        shutil.rmtree(root)
    home = root / "home"
    (home / "d" / "e" / "f").mkdir(parents=True)
    (home / "a.txt").write_text("hi")
    (home / "d" / "b.txt").write_text("x" * 100)
    (home / "lnk").symlink_to(home / "d")
    (home / "dangling").symlink_to("/nowhere")
    (home / "loop1").symlink_to("loop2")
    (home / "loop2").symlink_to("loop1")
    (home / "d" / "up").symlink_to("..")
    for name in ODD_NAMES:
        with open(os.path.join(os.fsencode(home), b"d", name), "wb") as f:
            f.write(b"odd")
    os.chmod(home / "d" / "e", 0o2755)
    for path in (home / "a.txt", home / "d" / "b.txt"):
        os.utime(path, ns=(0, 1_700_000_000_123_456_500))
    return home


def without_times(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_times(v) for k, v in value.items() if k != "modifiedTime"}
    if isinstance(value, list | tuple):
        return [without_times(v) for v in value]
    return value


@pytest.mark.parametrize(
    "request_",
    [
        *({"op": "stat", "path": p} for p in ("a.txt", "~/a.txt", "d/../a.txt", "lnk", "dangling", "loop1")),
        *(
            {"op": "stat", "path": p}
            for p in ("nope", "~", "/", "//", "d/b.txt/x", "~root", "~nobody-here/x")
        ),
        *({"op": "list", "path": "~", "depth": d} for d in (1, 2, 3, 20)),
        *({"op": "list", "path": p} for p in ("a.txt", "nope", "lnk", "dangling", "d/up")),
        *({"op": "read", "path": p} for p in ("a.txt", "d", "nope", "lnk", "loop1")),
    ],
)
def test_what_only_looks_answers_as_the_helper(tmp_path: Path, request_: dict[str, Any]) -> None:
    home = tree(tmp_path)
    helper, native_answer = (answer(argv, home) for argv in argvs(request_))
    assert native_answer == helper


@pytest.mark.parametrize(
    "request_",
    [
        *({"op": "mkdir", "path": p} for p in ("new/x/y", "a.txt", "a.txt/b", "d", "dangling/x", "/proc/x")),
        *({"op": "remove", "path": p} for p in ("a.txt", "d", "nope", "lnk", "dangling", "loop1")),
        {"op": "move", "source": "a.txt", "destination": "z/y.txt"},
        {"op": "move", "source": "nope", "destination": "q"},
        {"op": "move", "source": "d", "destination": "a.txt"},
        {"op": "move", "source": "lnk", "destination": "moved-link"},
        *({"op": "write", "path": p} for p in ("w/new.txt", "a.txt", "d", "lnk/in.txt", "dangling")),
    ],
)
def test_what_changes_answers_and_leaves_as_the_helper(tmp_path: Path, request_: dict[str, Any]) -> None:
    helper, native_side = on_fresh_trees(tmp_path, request_)
    assert native_side == helper


def test_a_move_to_another_file_system_copies_then_removes(tmp_path: Path) -> None:
    """/dev/shm is a tmpfs apart from the test's directory: rename fails with EXDEV."""
    for source in ("a.txt", "d", "lnk"):
        target = Path("/dev/shm") / f"corral-fs-{os.getpid()}-{source}"
        request = {"op": "move", "source": source, "destination": str(target)}
        helper, native_side = on_fresh_trees(tmp_path, request, target)
        assert native_side == helper
        assert native_side[0][0] == 0 and native_side[1][1]  # moved: the target was there


def test_names_that_are_not_text_come_back_as_python_names_them(tmp_path: Path) -> None:
    home = tree(tmp_path)
    code, out, _ = native({"op": "list", "path": "d"}, home)
    assert code == 0
    names = {e["name"] for e in out["entries"]}
    assert names == {os.fsdecode(n) for n in ODD_NAMES} | {"b.txt", "e", "up"}
    # Each name the answer gives names its file again (surrogate escapes back to the bytes).
    for entry in out["entries"]:
        code, again, err = native({"op": "stat", "path": entry["path"]}, home)
        assert (code, again, err) == (0, {"entry": entry}, None)


def test_paths_too_long_or_looping_fail_cleanly(tmp_path: Path) -> None:
    home = tree(tmp_path)
    helper, refused = (answer(argv, home) for argv in argvs({"op": "stat", "path": "x" * 5000}))
    assert refused == helper and refused[0] == 3 and refused[2]["code"] == "invalid_argument"
    assert "File name too long" in refused[2]["message"]
    # Many `..` collapse lexically, as the helper's normpath does: the root, nothing above it.
    code, out, _ = native({"op": "stat", "path": "../" * 5000}, home)
    assert code == 0 and out["entry"]["path"] == "/"
    # A loop of symlinks is an entry that leads nowhere; a listing never follows a link down.
    code, out, _ = native({"op": "list", "path": "d", "depth": 50}, home)
    assert code == 0 and sum(e["name"] == "up" for e in out["entries"]) == 1


@pytest.mark.parametrize(
    "args",
    [
        ["stat", "2f7"],  # odd
        ["stat", "zz"],  # not hex
        ["stat", "2f00"],  # a NUL inside
        ["stat", ""],
        ["list", "2f", "0", "100"],
        ["list", "2f", "1", "-5"],
        ["list", "2f", "1"],
        ["fly", "2f"],
        ["stat"],
    ],
)
def test_a_malformed_request_is_refused(tmp_path: Path, args: list[str]) -> None:
    code, out, err = answer([str(launcher.path()), "fs", *args], tmp_path)
    assert (code, out, err["code"]) == (3, b"", "invalid_argument")


def test_a_directory_past_the_answer_s_bound_is_refused(tmp_path: Path) -> None:
    many = tmp_path / "many"
    many.mkdir()
    for i in range(100_000):
        os.close(os.open(many / f"entry-{i}", os.O_CREAT | os.O_WRONLY, 0o644))
    request = {"op": "list", "path": str(many)}
    code, out, err = native(request, tmp_path, 1024 * 1024)
    assert (code, out) == (3, b"")
    assert err == {"code": "resource_exhausted", "message": "the answer is larger than 1048576 bytes"}
    code, out, _ = native(request, tmp_path)
    assert code == 0 and len(out["entries"]) == 100_000


def test_a_huge_sparse_file_streams_as_its_reader_takes_it(tmp_path: Path) -> None:
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as f:
        f.truncate(1 << 40)
    argv = argvs({"op": "read", "path": str(sparse)})[1]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env={"HOME": str(tmp_path)})
    assert proc.stdout is not None
    head = proc.stdout.read(1 + (1 << 20))
    assert head == b"\0" + bytes(1 << 20)
    proc.stdout.close()  # the reader gone: the launcher ends, holding nothing
    assert proc.wait() != 0


def test_an_upload_abandoned_midway_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "kept.txt"
    target.write_text("before")
    argv = argvs({"op": "write", "path": str(target)})[1]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env={"HOME": str(tmp_path)})
    assert proc.stdin is not None
    proc.stdin.write(b"half" * 50_000)
    proc.stdin.flush()
    partial = tmp_path / f".kept.txt.{proc.pid}.partial"
    deadline = time.monotonic() + 30
    while (partial.stat().st_size if partial.exists() else 0) < 200_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert partial.exists()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait() == 4
    assert not partial.exists() and target.read_text() == "before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"]


def test_the_fs_mode_says_its_protocol(tmp_path: Path) -> None:
    done = subprocess.run([str(launcher.path()), "fs", "version"], capture_output=True, check=False)
    assert (done.returncode, done.stdout) == (0, launcher.FS_PROTOCOL.encode() + b"\n")


def watched(argv: list[str], root: Path, steps: list[Callable[[], object]]) -> list[Any]:
    """What a watch said, from its first line to the event of a last file made after ``steps`` (each
    step's own events awaited first, so a new directory is watched before anything is made in it)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, env={"HOME": str(root), "PATH": os.defpath})
    assert proc.stdout is not None
    lines = [json.loads(proc.stdout.readline())]
    try:
        for i, step in enumerate([*steps, lambda: (root / "w" / "zz-end").touch()]):
            step()
            marker = root / "w" / f"step-{i}"
            marker.touch()
            while (line := json.loads(proc.stdout.readline())) != {
                "name": marker.name,
                "type": "EVENT_TYPE_CREATE",
            }:
                lines.append(line)
            marker.unlink()
            while json.loads(proc.stdout.readline()) != {"name": marker.name, "type": "EVENT_TYPE_REMOVE"}:
                pass
    finally:
        proc.kill()
        proc.wait()
    return lines


def test_a_watch_says_what_the_helper_s_says(tmp_path: Path) -> None:
    w = tmp_path / "w"
    odd = os.path.join(os.fsencode(w), b'odd\n"\xff')
    steps: list[Callable[[], object]] = [
        lambda: (w / "a").write_text("x"),
        lambda: os.chmod(w / "a", 0o600),
        lambda: os.rename(w / "a", w / "b"),
        lambda: (w / "sub").mkdir(),
        lambda: (w / "sub" / "c").write_text("deep"),
        lambda: (w / "sub" / "d").mkdir(),
        lambda: (w / "sub" / "d" / "e").touch(),
        lambda: open(odd, "wb").close(),
        lambda: os.unlink(odd),
        lambda: shutil.rmtree(w / "sub"),
    ]
    for recursive in (False, True):
        said = []
        for argv in argvs({"op": "watch", "path": "w", "recursive": recursive}):
            if w.exists():
                shutil.rmtree(w)
            w.mkdir()
            said.append(watched(argv, tmp_path, steps))
        assert said[1] == said[0]
        assert said[1][0] == {"start": str(w)}
        assert {"name": 'odd\n"\udcff', "type": "EVENT_TYPE_CREATE"} in said[1]
        assert ({"name": "sub/d/e", "type": "EVENT_TYPE_CREATE"} in said[1]) == recursive


@pytest.mark.parametrize("path", ["a.txt", "nope", "dangling"])
def test_a_watch_of_what_is_no_directory_fails_as_the_helper_s(tmp_path: Path, path: str) -> None:
    home = tree(tmp_path)
    helper, refused = (answer(argv, home) for argv in argvs({"op": "watch", "path": path, "recursive": True}))
    assert refused == helper and refused[0] == 3
