"""``kubectl get``'s Table: the server formats the cells (:func:`render.sandbox_cells`,
:func:`render.cells`), each row carrying the object's metadata (``PartialObjectMetadata``) or, when
asked, the whole object."""

from __future__ import annotations

from typing import Any

from corral.api.kube.kinds import Kind

Obj = dict[str, Any]


def wants_table(accept: str) -> bool:
    return "as=Table" in accept


def columns(kind: Kind) -> list[Obj]:
    return [
        {
            "name": c.name,
            "type": c.type,
            "format": c.format,
            "description": c.description,
            "priority": c.priority,
        }
        for c in kind.columns
    ]


def row(cells: list[Any], meta: Obj, obj: Obj | None, include: str) -> Obj:
    """A row: its cells, and what ``includeObject`` asks of it (``Object`` needs ``obj``)."""
    out: Obj = {"cells": cells}
    if include == "Object":
        out["object"] = obj
    elif include != "None":
        out["object"] = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}
    return out


def table(kind: Kind, rows: list[Obj], version: int, *, headers: bool = True, more: str | None = None) -> Obj:
    """``more``: the ``continue`` token of the next page, if there is one."""
    meta: Obj = {"resourceVersion": str(version)}
    if more is not None:
        meta["continue"] = more
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": columns(kind) if headers else [],
        "rows": rows,
    }
