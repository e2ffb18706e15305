"""The SDK must be usable without the server: importing it loads nothing of corral outside corral.client
but the wire's shared vocabulary, the error codes and the exec result (the import statements themselves are checked, file by file, in tests/test_layers.py)."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_sdk_loads_no_server_module() -> None:
    code = (
        "import sys, corral.client, corral.client.cli, corral.client.burst;"
        "print(sorted(m for m in sys.modules if m.startswith('corral') and m not in ('corral', 'corral.codes', 'corral.exec_result') and not m.startswith('corral.client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
