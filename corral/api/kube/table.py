"""``kubectl get``'s Table: the server formats the cells (:func:`render.cells`), each row carrying
the object's metadata (``PartialObjectMetadata``) or, when asked, the whole object."""

from __future__ import annotations

from typing import Any

from corral.api.kube import render
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


def row(kind: Kind, obj: Obj, include: str, now: float) -> Obj:
    if include == "Object":
        inner: Obj | None = obj
    elif include == "None":
        inner = None
    else:
        inner = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]}
    out: Obj = {"cells": render.cells(kind, obj, now)}
    if inner is not None:
        out["object"] = inner
    return out


def table(
    kind: Kind, objs: list[Obj], version: int, include: str, now: float, *, headers: bool = True
) -> Obj:
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": str(version)},
        "columnDefinitions": columns(kind) if headers else [],
        "rows": [row(kind, o, include, now) for o in objs],
    }
