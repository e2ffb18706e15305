"""The launcher: its build cache, the spec a command travels in (checked against the C decoder itself),
the bounds that keep execve's E2BIG away, and the seccomp filter it exports."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.runtime import launcher

_TEXT = st.text(st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=40)
_ENV_KEY = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,15}", fullmatch=True)


def _decode(spec: bytes) -> list[bytes]:
    """What the launcher's own parser reads from ``spec``: cwd, argv, "--", env."""
    done = subprocess.run(
        [str(launcher.path()), "check-spec"],
        input=spec,
        capture_output=True,
        check=False,
        env=launcher.clean_env(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split(b"\0")[:-1]


@settings(max_examples=40, deadline=None)
@given(
    command=st.lists(_TEXT, min_size=1, max_size=6),
    env=st.dictionaries(_ENV_KEY, _TEXT, max_size=6),
    cwd=_TEXT.map(lambda t: "/" + t),
)
def test_the_launcher_decodes_exactly_what_was_encoded(
    command: list[str], env: dict[str, str], cwd: str
) -> None:
    decoded = _decode(launcher.encode(command, env, cwd))
    expected = [cwd, *command, "--", *(f"{k}={v}" for k, v in env.items())]
    assert decoded == [item.encode() for item in expected]


@pytest.mark.parametrize(
    "spec",
    [
        b"",
        b"corral-exec-2\0/\x001\0true\x000\0",  # another format
        b"corral-exec-1\0relative\x001\0true\x000\0",  # cwd not absolute
        b"corral-exec-1\0/\x000\x000\0",  # no command
        b"corral-exec-1\0/\x002\0true\x000\0",  # fewer arguments than counted
        b"corral-exec-1\0/\x001\0true\x000\0extra\0",  # trailing bytes
        b"corral-exec-1\0/\x001\0true\x00999999999\0",  # a count past the bound
        b"corral-exec-1\0/\x001\0true\x000",  # no final NUL
    ],
)
def test_the_launcher_refuses_a_malformed_spec(spec: bytes) -> None:
    done = subprocess.run(
        [str(launcher.path()), "check-spec"],
        input=spec,
        capture_output=True,
        check=False,
        env=launcher.clean_env(),
    )
    assert done.returncode == 125 and b"corral-launcher" in done.stderr


@pytest.mark.parametrize(
    ("command", "env", "cwd", "field"),
    [
        ([], {}, "/", "command"),
        (["a\0b"], {}, "/", "command"),
        (["x" * (launcher.MAX_STRING_BYTES + 1)], {}, "/", "command"),
        (["x" * 100_000] * 11, {}, "/", "command"),  # each fits, together past the bound
        (["true"], {"A=B": "c"}, "/", "env"),
        (["true"], {"": "c"}, "/", "env"),
        (["true"], {"1A": "c"}, "/", "env"),
        (["true"], {"A-B": "c"}, "/", "env"),
        (["true"], {"A": "c\0d"}, "/", "env"),
        (["true"], {"A": "v" * 200_000}, "/", "env"),
        (["true"], {f"K{i}": "v" * 100_000 for i in range(11)}, "/", "env"),
        (["true"], {}, "relative", "cwd"),
        (["true"], {}, "/a\0b", "cwd"),
        (["true"], {}, "/" + "d" * 5000, "cwd"),
    ],
)
def test_what_execve_would_refuse_is_refused_first(
    command: list[str], env: dict[str, str], cwd: str, field: str
) -> None:
    with pytest.raises(launcher.BadCommand) as refused:
        launcher.encode(command, env, cwd)
    assert refused.value.field == field


def test_the_largest_accepted_command_really_runs() -> None:
    # The bound is corral's, under the kernel's: what passes the check passes execve.
    env = {f"K{i}": "v" * 100_000 for i in range(9)}
    launcher.check_command(["true"], env, "/")
    done = subprocess.run(["/usr/bin/env", "true"], env=env, check=False)
    assert done.returncode == 0


def test_the_build_is_cached_by_source_hash_in_a_private_directory(tmp_path: Path) -> None:
    builds = (
        (launcher.path(), launcher.SOURCE, "launcher", launcher._CFLAGS, launcher._LIBS),
        (launcher.statx_shim(), launcher.SHIM_SOURCE, "statx-shim.so", launcher.SHIM_CFLAGS, ()),
    )
    for path, source, name, flags, libs in builds:
        assert path.name == launcher.cache_name(source, name, flags, libs)
        # An edited source is another build.
        edited = tmp_path / source.name
        edited.write_bytes(source.read_bytes() + b"\n/* edited */\n")
        assert launcher.cache_name(edited, name, flags, libs) != path.name
        info = os.stat(path.parent)
        assert info.st_uid == os.geteuid() and info.st_mode & 0o077 == 0
        assert os.stat(path).st_mode & 0o077 == 0


def test_a_cache_others_can_write_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(shared))
    launcher.path.cache_clear()
    try:
        assert "writable only by" in (launcher.unavailable_reason() or "")
    finally:
        launcher.path.cache_clear()


def test_a_missing_compiler_makes_the_runtime_say_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CORRAL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    launcher.path.cache_clear()
    try:
        assert "gcc" in (launcher.unavailable_reason() or "")
    finally:
        launcher.path.cache_clear()


def test_the_exported_filter_is_bpf() -> None:
    bpf = launcher.seccomp_bpf()
    # struct sock_filter is 8 bytes; libseccomp's filter checks the architecture first.
    assert len(bpf) % 8 == 0 and 10 < len(bpf) // 8 < 4096
