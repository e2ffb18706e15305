"""Without PostgreSQL the PostgreSQL cases skip with a message; under CI=true they fail instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run_pg_case(ci: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "CI": ci,
        # Nothing listens on loopback port 9: the server is "missing".
        "CORRAL_TEST_POSTGRES_URL": "postgresql://postgres@127.0.0.1:9/test",
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/store/test_leases.py",
            "-k",
            "clean_release and postgres",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_missing_postgres_skips_locally_and_fails_under_ci() -> None:
    local = run_pg_case("false")
    assert local.returncode == 0, local.stdout + local.stderr
    assert "1 skipped" in local.stdout and "PostgreSQL not reachable" in local.stdout
    ci = run_pg_case("true")
    assert ci.returncode != 0, ci.stdout + ci.stderr
    assert "under CI the PostgreSQL tests must run" in ci.stdout
