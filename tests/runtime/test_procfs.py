"""What the runtime writes under /proc for a sandbox's skeleton (a fake /proc: lowering a score needs
CAP_SYS_RESOURCE, which not every test machine grants)."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.runtime import procfs


def test_the_skeleton_is_protected_without_lowering_the_floor_its_children_inherit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procfs, "_PROC", tmp_path)
    (tmp_path / "123").mkdir()
    assert procfs.protect_from_oom_killer(123)
    # The legacy file: a privileged write to oom_score_adj would also set the init's
    # oom_score_adj_min, and every command the init forks could then lower itself that far.
    assert (tmp_path / "123" / "oom_adj").read_text() == "-16"
    assert not (tmp_path / "123" / "oom_score_adj").exists()


def test_a_process_already_gone_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procfs, "_PROC", tmp_path)
    assert not procfs.protect_from_oom_killer(99999)
