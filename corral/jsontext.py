"""JSON text for what the server writes on every request (a create's answer, its placement
explanation, its log line): orjson, several times faster than the standard library's encoder on these
small documents, compact (no spaces) like ``separators=(",", ":")``."""

from __future__ import annotations

from typing import Any

import orjson


def dump_bytes(obj: Any) -> bytes:
    return orjson.dumps(obj)


def dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()


def dumps_sorted(obj: Any) -> str:
    """Keys in order: the same mapping always gives the same text."""
    return orjson.dumps(obj, option=orjson.OPT_SORT_KEYS).decode()


def dumps_any(obj: Any) -> str:
    """Whatever a log line holds: anything JSON has no type for as its ``str``, keys that are not
    strings as text."""
    return orjson.dumps(obj, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
