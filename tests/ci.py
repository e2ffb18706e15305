"""The suite's rule for what a machine lacks: a test that needs it skips with the reason locally, and
fails under ``CI=true``, where the repository's own set-up must have provided it."""

from __future__ import annotations

import os

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def require(missing: str | None, ci_note: str = "") -> None:
    """Nothing when ``missing`` is None; else skip with it, or fail under CI."""
    if missing is None:
        return
    if under_ci():
        pytest.fail(missing + ci_note, pytrace=False)
    pytest.skip(missing)
