"""One name, one thing: no two classes of the server share a name, and no two of the SDK do (the SDK's
side includes what it shares with the server: the API's shapes, the exec result, the codes). A server
class may carry the name of an SDK class (``SandboxRecord``, ``Forbidden``): the SDK's is the same wire
thing received on the other side, and its names are public API. Read with ``ast``, nothing imported."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.test_layers import SHARED_WITH_CLIENT

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "corral"

# The simulator models the server (its hosts, its metrics) and keeps its own names for them.
OUTSIDE = ("corral/sim/",)
# Still two classes under one name, each with an owner of its own: the agent's wire heartbeat and the
# store's stored one.
PENDING = {"Heartbeat"}
# The SDK as it ships: the client and what it shares with the server.
SDK = (
    "corral/client/",
    *(f"corral/{part}/" for part in SHARED_WITH_CLIENT),
    *(f"corral/{part}.py" for part in SHARED_WITH_CLIENT),
)


def classes_by_name(side: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative.startswith(OUTSIDE) or relative.startswith(SDK) != (side == "client"):
            continue
        for node in ast.parse(path.read_text(), filename=relative).body:
            if isinstance(node, ast.ClassDef):
                found[node.name].append(f"{relative}:{node.lineno}")
    return found


def _shared(side: str) -> list[str]:
    return [
        f"{name}: {', '.join(where)}"
        for name, where in classes_by_name(side).items()
        if len(where) > 1 and name not in PENDING
    ]


def test_no_two_server_classes_share_a_name() -> None:
    shared = _shared("server")
    assert not shared, "rename one of each:\n" + "\n".join(shared)


def test_no_two_sdk_classes_share_a_name() -> None:
    shared = _shared("client")
    assert not shared, "rename one of each:\n" + "\n".join(shared)


def test_the_scan_sees_every_side() -> None:
    server, client = classes_by_name("server"), classes_by_name("client")
    assert "ControlPlane" in server and "ControlPlane" not in client
    assert "AsyncCorral" in client and "AsyncCorral" not in server
    assert "ExecResult" in client and "ExecResult" not in server
