"""``make serve`` passes flags through to ``corral serve`` (``ARGS``) and says what its first run does;
``make security-gvisor`` runs the whole gVisor half of the hostile suite."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_make_serve_passes_its_args_to_corral_serve() -> None:
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "serve", "ARGS=--port 9000 --hosts 4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines()[-1] == ".venv/bin/corral serve --port 9000 --hosts 4"


def test_a_first_run_says_what_it_is_setting_up() -> None:
    makefile = (ROOT / "Makefile").read_text()
    setup = makefile[makefile.index("$(STAMP): pyproject.toml") :].split("\n\n")[0]
    assert "making the virtual environment" in setup and "installing corral" in setup


def test_make_security_gvisor_runs_the_whole_gvisor_half_of_the_hostile_suite() -> None:
    from tests.security.conftest import WHOLE_GVISOR_HALF

    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "security-gvisor"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.splitlines()[-1].startswith(f"{WHOLE_GVISOR_HALF}=all .venv/bin/pytest ")
    assert done.stdout.splitlines()[-1].endswith(" tests/security")
