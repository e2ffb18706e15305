"""What the template endpoints (``client.templates``) answer: the server's own shapes
(:mod:`corral.shapes.templates`), where a template lives, and the bodies its builds send."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from corral.shapes.templates import Build, BuildFailure, Template, TemplateList

__all__ = ["Build", "BuildFailure", "Template", "TemplateList", "template_path"]

UPLOAD_TIMEOUT_S = 600.0  # an archive's upload
FOLLOW_WAIT_S = 10.0  # one poll of a build's log waits this long for a new line


def template_path(name: str) -> str:
    return f"/v1/templates/{quote(name, safe='')}"


def sizes_params(cpus: float | None, memory_mb: int | None, disk_mb: int | None) -> dict[str, float | int]:
    given = {"cpus": cpus, "memory_mb": memory_mb, "disk_mb": disk_mb}
    return {k: v for k, v in given.items() if v is not None}


def template_build_body(
    recipe: str, context: bool, cpus: float | None, memory_mb: int | None, disk_mb: int | None
) -> dict[str, Any]:
    return {"recipe": recipe, "context": context, **sizes_params(cpus, memory_mb, disk_mb)}
