"""The SDK must be usable without the server: it imports nothing of corral outside corral.client."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import corral.client

PACKAGE = Path(corral.client.__file__).parent


def test_no_module_of_the_sdk_imports_server_code() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [
                f"{path.name}: {n}"
                for n in names
                if n.split(".")[0] == "corral" and not n.startswith("corral.client")
            ]
    assert offenders == []


def test_importing_the_sdk_loads_no_server_module() -> None:
    code = (
        "import sys, corral.client, corral.client.cli, corral.client.burst;"
        "print(sorted(m for m in sys.modules if m.startswith('corral') and m != 'corral' and not m.startswith('corral.client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
