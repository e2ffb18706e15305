"""Every error code is written once, in ``corral/codes.py``: elsewhere the package names ``ErrorCode.X``.
A string literal equal to a registered code is a second source that a rename would miss, so it fails
here with its file and line. Read with ``ast``, so comments and docstrings do not count."""

from __future__ import annotations

import ast
from pathlib import Path

from corral.codes import ErrorCode

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "corral"
CODES = {c.value for c in ErrorCode}

# These speak the Connect protocol of the sandbox data plane: its codes ("not_found", "internal") are
# that protocol's own vocabulary, which shares a few words with ours and must not change with it.
CONNECT_PROTOCOL = {
    "corral/agent/envd/connect.py",
    "corral/agent/envd/calls.py",
    "corral/agent/envd/processes.py",
    "corral/agent/envd/files.py",
    "corral/agent/envd/helper.py",
    "corral/agent/envd/watch.py",
    # Template builds: a build's status and its log levels ("error") are E2B's words, which the one
    # build service behind E2B's build API and corral's own speaks.
    "corral/api/e2b/builds.py",
    "corral/control/builds.py",
}


def _not_values(tree: ast.AST) -> set[int]:
    """Strings that are names, not values: docstrings, dict keys, subscripts, ``in`` tests and ``.get`` keys (the
    error body's ``"error"`` field shares its word with ``ErrorCode.ERROR``)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        elif isinstance(node, ast.Dict):
            skip |= {id(k) for k in node.keys if k is not None}
        elif isinstance(node, ast.Subscript):
            skip.add(id(node.slice))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            skip.add(id(node.left))  # ``"error" in body``: a key looked for
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "get"
            and node.args
        ):
            skip.add(id(node.args[0]))
    return skip


def loose_codes(path: Path, relative: str) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _not_values(tree)
    return [
        f"{relative}:{node.lineno}: {node.value!r} is ErrorCode.{ErrorCode(node.value).name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value in CODES
        and id(node) not in skip
    ]


def test_no_error_code_is_written_as_a_string_outside_the_registry() -> None:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = str(path.relative_to(ROOT))
        if relative == "corral/codes.py" or relative in CONNECT_PROTOCOL:
            continue
        bad += loose_codes(path, relative)
    assert not bad, "import the code from corral.codes instead:\n" + "\n".join(bad)


def test_the_scan_finds_a_loose_code_and_passes_over_names(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        '"""no_capacity in a docstring is prose."""\n'
        'body = {"error": {"code": "x"}}\n'
        'err = body["error"] or body.get("error")\n'
        'def refuse():\n    return "no_capacity"\n'
    )
    assert loose_codes(probe, "probe.py") == ["probe.py:5: 'no_capacity' is ErrorCode.NO_CAPACITY"]
