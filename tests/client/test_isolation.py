"""The SDK must be usable without the server: importing it loads nothing of corral outside corral.client
but the wire's shared vocabulary: the error codes, the exec result and the API's shapes (the import
statements themselves are checked, file by file, in tests/test_layers.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.test_layers import SHARED_WITH_CLIENT


def test_importing_the_sdk_loads_no_server_module() -> None:
    allowed = ("client", *SHARED_WITH_CLIENT)
    code = (
        "import sys, corral.client, corral.client.cli, corral.client.burst;"
        "print(sorted(m for m in sys.modules if m.startswith('corral.')"
        f" and m.split('.')[1] not in {allowed!r}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
