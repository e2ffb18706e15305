"""A JSON answer encoded by orjson: for documents built as plain dicts and lists (a sandbox, a page of
them, a Table of 10,000 rows), several times faster than the standard library's encoder."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from corral.jsontext import dump_bytes


class OrjsonResponse(JSONResponse):
    def render(self, content: Any) -> bytes:
        return dump_bytes(content)
