"""How a file operation's request becomes the command that runs it inside the sandbox, as its user:
the launcher's ``fs`` mode where the runtime offers it there (no interpreter of the sandbox's needed,
no interpreter's start-up paid), else :mod:`corral.agent.envd.helper` under the sandbox's python3.
Both answer alike (see helper.py's docstring), so the callers read either the same way.

For the launcher, a path travels as the hex of its bytes (a name the sandbox made need not be UTF-8;
the helper's strings carry such bytes as surrogate escapes): nothing on its command line is parsed
but hex and numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from corral.agent.envd.connect import RpcError
from corral.runtime.base import GuestFiles, Runtime

_HELPER = Path(__file__).with_name("helper.py").read_text()
# A path's bytes on the launcher's command line (twice that in hex): well within one argument's bound
# (corral.runtime.launcher.MAX_STRING_BYTES), and eight times the longest path the kernel resolves.
MAX_PATH_BYTES = 32 * 1024
# A listing's depth: no tree is deeper than a path is long, so this bound changes no answer.
_MAX_DEPTH = MAX_PATH_BYTES
_ONE_PATH = ("stat", "mkdir", "remove", "read", "write")


def helper_command(request: dict[str, Any]) -> list[str]:
    return ["python3", "-I", "-c", _HELPER, json.dumps(request)]


async def fs_command(
    runtime: Runtime, sandbox_id: str, request: dict[str, Any], answer_limit: int
) -> list[str]:
    """The command answering ``request`` (helper.py's request: ``op`` and its fields) in this sandbox;
    a listing's answer is refused past ``answer_limit`` bytes."""
    program = await runtime.guest_program(sandbox_id) if isinstance(runtime, GuestFiles) else None
    if program is None:
        return helper_command(request)
    return native_command(program, request, answer_limit)


def native_command(program: str, request: dict[str, Any], answer_limit: int) -> list[str]:
    op = request.get("op")
    if op in _ONE_PATH:
        args = [_path(request.get("path"))]
    elif op == "list":
        args = [_path(request.get("path")), str(_depth(request.get("depth"))), str(answer_limit)]
    elif op == "move":
        args = [_path(request.get("source")), _path(request.get("destination"))]
    elif op == "watch":
        args = [_path(request.get("path")), "1" if request.get("recursive") else "0"]
    else:
        raise RpcError("invalid_argument", f"unknown operation {op!r}")
    return [program, "fs", str(op), *args]


def _path(value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise RpcError("invalid_argument", "path must be a non-empty string")
    try:
        raw = value.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        raise RpcError("invalid_argument", "path holds an unpaired surrogate") from None
    if len(raw) > MAX_PATH_BYTES:
        raise RpcError("invalid_argument", f"path is longer than {MAX_PATH_BYTES} bytes")
    return raw.hex()


def _depth(value: Any) -> int:
    try:
        depth = int(value or 1)
    except (TypeError, ValueError):
        raise RpcError("invalid_argument", "depth must be a number") from None
    return min(max(1, depth), _MAX_DEPTH)
