"""Structured logs: one formatter for JSON lines (what a log pipeline reads), one for people at a
terminal, and a per-request bag of fields the code serving a request adds to its one log line.

Only what is put in the bag, or passed as ``extra={"fields": {...}}``, reaches a line: never headers,
bodies, tokens or a sandbox's environment.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from typing import Any, TextIO

from corral.jsontext import dumps_any

FORMATS = ("auto", "json", "text")
_ENCODE = dumps_any

_request_fields: ContextVar[dict[str, Any] | None] = ContextVar("corral_request_fields", default=None)


def begin_request(fields: dict[str, Any]) -> object:
    """Start collecting ``fields`` for the request being served; returns a token for ``end_request``."""
    return _request_fields.set(fields)


def end_request(token: object) -> None:
    _request_fields.reset(token)  # type: ignore[arg-type]


def note(**fields: Any) -> None:
    """Add fields to the current request's log line (a no-op outside a request)."""
    bag = _request_fields.get()
    if bag is not None:
        bag.update(fields)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, then the record's ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _ENCODE(out)


class TextFormatter(logging.Formatter):
    """For a terminal: time, level, message, then ``key=value`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%H:%M:%S", time.localtime(record.created))
        line = f"{stamp} {record.levelname:<7} {record.getMessage()}"
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={_text(v)}" for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value if value and " " not in value else json.dumps(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def formatter_for(fmt: str, stream: TextIO) -> logging.Formatter:
    """``auto``: text on a terminal, JSON otherwise."""
    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}")
    if fmt == "auto":
        fmt = "text" if stream.isatty() else "json"
    return TextFormatter() if fmt == "text" else JsonFormatter()


def configure(fmt: str = "auto", level: int = logging.INFO, stream: TextIO | None = None) -> None:
    """Route every logger to ``stream`` (stderr) in the chosen format."""
    stream = stream or sys.stderr
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter_for(fmt, stream))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    # No formatter here prints the caller's source line, thread or process: with these off, a log
    # record (one per request) skips a stack walk and three lookups it would only throw away.
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
