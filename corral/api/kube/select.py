"""Label and field selectors as kubectl sends them (``-l``, ``--field-selector``): equality, inequality,
existence, and set membership; anything else is refused (400), never guessed at."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from corral.codes import ErrorCode
from corral.control.errors import ControlError

Obj = dict[str, Any]
Test = Callable[[Obj], bool]

_SET = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")
_FIELDS: dict[str, Callable[[Obj], str]] = {
    "metadata.name": lambda o: o["metadata"]["name"],
    "metadata.namespace": lambda o: o["metadata"]["namespace"],
}
MAX_SELECTOR = 4096


class BadSelector(ControlError):
    code = ErrorCode.BAD_SELECTOR


def _terms(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return [t.strip() for t in out if t.strip()]


def labels(text: str | None) -> Test:
    if not text:
        return lambda _: True
    if len(text) > MAX_SELECTOR:
        raise BadSelector("labelSelector: too long")
    tests: list[Test] = []
    for term in _terms(text):
        tests.append(_label_term(term))
    return lambda o: all(t(o.get("metadata", {}).get("labels") or {}) for t in tests)


def _label_term(term: str) -> Test:
    m = _SET.match(term)
    if m:
        key, op, values = m.group(1), m.group(2), {v.strip() for v in m.group(3).split(",")}
        if op == "in":
            return lambda ls: ls.get(key) in values
        return lambda ls: ls.get(key) not in values
    for op in ("!=", "==", "="):
        if op in term:
            key, _, value = (p.strip() for p in term.partition(op))
            if not key:
                break
            if op == "!=":
                return lambda ls: ls.get(key) != value
            return lambda ls: ls.get(key) == value
    if term.startswith("!") and re.match(r"^![\w./-]+$", term):
        return lambda ls: term[1:] not in ls
    if re.match(r"^[\w./-]+$", term):
        return lambda ls: term in ls
    raise BadSelector(f"labelSelector: cannot parse {term[:64]!r}")


def _field_test(get: Callable[[Obj], str], value: str, neg: bool) -> Test:
    return (lambda o: get(o) != value) if neg else (lambda o: get(o) == value)


def fields(
    text: str | None, known: dict[str, Callable[[Obj], str]] = _FIELDS, pin: str = "metadata.name"
) -> tuple[Test, str | None]:
    """The test, and the name it pins (``pin=X``), which a read can go straight to. ``known``: the
    fields it may select on."""
    if not text:
        return (lambda _: True), None
    if len(text) > MAX_SELECTOR:
        raise BadSelector("fieldSelector: too long")
    tests: list[Test] = []
    pinned = None
    for term in _terms(text):
        neg = "!=" in term
        key, _, value = (p.strip() for p in term.replace("!=", "=").replace("==", "=").partition("="))
        get = known.get(key)
        if get is None:
            raise BadSelector(f'fieldSelector: "{key[:64]}" is not a field these resources select on')
        tests.append(_field_test(get, value, neg))
        if not neg and key == pin:
            pinned = value
    return (lambda o: all(t(o) for t in tests)), pinned
