"""Older SDKs the suite keeps working: 2.45 (the first to refuse, before sending anything, a key not of
E2B's ``e2b_<hex>`` form) and 2.50 (the older create and connect routes), each unmodified in its own
venv, running a program written for E2B against the same ``corral serve``."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2b.conftest import Corral
from tests.e2b.sdks import sdk_python

PROGRAM = Path(__file__).with_name("old_sdk_program.py")

pytestmark = pytest.mark.timeout(300)  # the first run makes the SDK's venv (a pip install)


@pytest.mark.parametrize("version", ["2.45.0", "2.50.0"])
def test_an_older_sdk_runs_a_program_unchanged(corral: Corral, version: str) -> None:
    python = sdk_python(version)
    key = corral.admin.post("/v1/tenants/alice/e2b-keys").json()["key"]  # e2b_<hex>: 2.45 checks
    env = {**os.environ, "E2B_API_URL": corral.url, "E2B_SANDBOX_URL": corral.url, "E2B_API_KEY": key}
    tag = f"sdk-{version}-{time.monotonic_ns()}"
    done = subprocess.run(
        [str(python), str(PROGRAM), tag], env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["version"] == version
    assert out["run"] == "hi\nuser\n" and out["listed"] == [True]
    assert out["running_while_paused"] is False and out["read_after_resume"] == "written"
    assert out["state"] == "running" and out["killed"] is True
    if version == "2.45.0":
        # Refused by the SDK itself, before any request: why corral issues keys of that form.
        assert out["odd_key"].startswith("AuthenticationException: Invalid API key format"), out
    else:
        # Sent, and refused by corral as E2B refuses an unknown key.
        assert out["odd_key"].startswith("AuthenticationException"), out
        assert "Invalid API key format" not in out["odd_key"]
