"""One registry of error codes: every error class's code is declared there, with the status the class
answers with, and no module writes a code as a loose string."""

from __future__ import annotations

import ast
from pathlib import Path

from corral.agent.errors import AgentError
from corral.client.errors import CorralError
from corral.codes import RETRYABLE, ErrorCode
from corral.control.errors import BadGateway, ControlError
from corral.core.refusals import Refusal
from corral.runtime.base import RuntimeFailure
from corral.store import StoreError

ROOT = Path(__file__).resolve().parent.parent
# The pure core imports nothing of corral; its two refusal codes are checked against the registry below.
EXEMPT = {ROOT / "corral" / "codes.py", *(ROOT / "corral" / "core").rglob("*.py")}
CODE_NAMES = {"code", "default_code"}


def _subclasses(base: type) -> list[type]:
    found, todo = [], [base]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return found


def test_every_error_class_code_is_registered_with_its_status() -> None:
    bad = []
    for base in (ControlError, AgentError, StoreError, RuntimeFailure, Refusal, CorralError):
        for cls in _subclasses(base):
            if cls is Refusal:
                continue  # abstract: only its subclasses' codes are answered
            code = getattr(cls, "default_code", None) or getattr(cls, "code", None)
            if code is None:
                continue
            try:
                registered = ErrorCode(code)
            except ValueError:
                bad.append(f"{cls.__module__}.{cls.__name__}: {code!r} is not in corral.codes")
                continue
            status = cls.__dict__.get("status")
            if isinstance(status, int) and status != registered.status:
                bad.append(f"{cls.__name__} answers {status}, {code} is {registered.status}")
    assert not bad, "\n".join(bad)


def test_core_refusals_are_retryable_503s() -> None:
    for cls in _subclasses(Refusal)[1:]:
        assert ErrorCode(cls.code) in RETRYABLE and ErrorCode(cls.code).status == 503


def test_every_retryable_code_is_a_503_but_the_tenant_rate() -> None:
    pace = {ErrorCode.TENANT_RATE_LIMITED}
    assert RETRYABLE and all(c.status == 503 for c in RETRYABLE - pace)
    assert all(not c.retryable for c in ErrorCode if c.status != 503 and c not in pace)
    assert all(c.retryable and c.status == 429 for c in pace)


def _loose_codes(path: Path) -> list[str]:
    """String literals given as a code: ``code = "x"``, ``code="x"`` or ``{"code": "x"}``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        pairs: list[tuple[str | None, ast.expr]] = []
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            pairs += [(t.id if isinstance(t, ast.Name) else None, node.value) for t in targets]
        elif isinstance(node, ast.Call):
            pairs += [(k.arg, k.value) for k in node.keywords]
        elif isinstance(node, ast.Dict):
            pairs += [
                (k.value if isinstance(k, ast.Constant) else None, v)
                for k, v in zip(node.keys, node.values, strict=True)
            ]
        for name, value in pairs:
            if name in CODE_NAMES and isinstance(value, ast.Constant) and isinstance(value.value, str):
                found.append(f"{path.relative_to(ROOT)}:{value.lineno} {name}={value.value!r}")
    return found


def test_no_module_writes_a_code_as_a_string() -> None:
    bad = [hit for f in sorted((ROOT / "corral").rglob("*.py")) if f not in EXEMPT for hit in _loose_codes(f)]
    assert not bad, "use corral.codes.ErrorCode:\n" + "\n".join(bad)


def test_the_scan_sees_each_way_of_writing_a_code(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        'class E:\n    code = "a"\n    default_code: str = "b"\nf(code="c")\nx = {"code": "d"}\n'
    )
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        found = _loose_codes(probe)
    finally:
        ROOT = saved
    assert [h.split(" ", 1)[1] for h in found] == ["code='a'", "default_code='b'", "code='c'", "code='d'"]


def test_a_control_error_answers_with_its_class_codes_status() -> None:
    class Refused(ControlError):
        code = ErrorCode.PAYLOAD_TOO_LARGE

    assert Refused.status == Refused().status == 413
    # An agent's code passed through keeps the status of the class that carries it.
    passed = BadGateway("the agent said so", code=ErrorCode.IMAGE_UNAVAILABLE)
    assert (passed.code, passed.status) == (ErrorCode.IMAGE_UNAVAILABLE, 502)
