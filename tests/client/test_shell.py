"""What ``corral shell`` makes of a line: the shell's own (``cd``, ``export``, ``exit``) only when the
line is nothing else; anything else runs as typed."""

from __future__ import annotations

import pytest

from corral.client.shell_cli import parse_line


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("", "empty"),
        ("   # a comment", "empty"),
        ("ls -la", "run"),
        ("cd", "cd"),
        ("cd /tmp", "cd"),
        ("cd '/a dir'", "cd"),
        ("cd /tmp && ls", "run"),
        ("cd /tmp; rm -rf x", "run"),
        ("cd $(echo /)", "run"),
        ("export A=1 B=two", "export"),
        ("export A", "run"),
        ("export A=1; id", "run"),
        ("export 1A=x", "run"),
        ("exit", "exit"),
        ("exit 3", "exit"),
        ("exit 3 | cat", "run"),
        ("echo 'unbalanced", "run"),
    ],
)
def test_a_line_is_the_shells_own_only_when_it_is_nothing_else(text: str, kind: str) -> None:
    assert parse_line(text).kind == kind


def test_what_each_kind_carries() -> None:
    assert parse_line("ls -la | head").argv == ["sh", "-c", "ls -la | head"]
    cd = parse_line("cd '/a dir'")
    assert cd.argv[:2] == ["sh", "-c"] and cd.argv[-1] == "/a dir"
    assert parse_line("cd").argv[-1] == "sh"  # no directory: home, as sh does
    assert parse_line("export A=1 B='x y'").env == {"A": "1", "B": "x y"}
    assert parse_line("exit 3").code == 3 and parse_line("exit").code is None
