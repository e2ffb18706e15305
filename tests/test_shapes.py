"""Every shape the server and the SDK exchange is declared once (:mod:`corral.shapes`): no class of the
server's and none of the SDK's has (nearly) the fields of a class on another side. Shapes are compared by
their field names, so a copy that has drifted by a field or two is found as well as an exact one."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterator

from pydantic import BaseModel

import corral
from corral.api.pools import PoolBody
from corral.api.schemas import SandboxSpecBody, sandbox_json
from corral.client.models import Host, SandboxRecord
from corral.client.retry import RetryPolicy
from corral.shapes.hosts import Host as SharedHost
from corral.shapes.sandboxes import SandboxRecord as SharedSandboxRecord
from corral.shapes.tokens import TokenInfo
from corral.store.records import SandboxRecord as StoreSandboxRecord
from corral.store.records import SandboxState, TokenRecord

# What both import (tests/test_layers.py holds them to importing nothing else of corral).
SHARED = ("shapes", "exec_result", "codes")
# Two shapes are one when this share of their fields' names is common to both (a shape renamed on
# one side, or one that gained a field the other never learnt, is still the same shape); records and
# the answers made of them share less (a store's ``tenant_id`` is the answer's ``tenant``).
SAME_SHAPE = 0.8


def fields_of(cls: type) -> frozenset[str] | None:
    if issubclass(cls, BaseModel):
        return frozenset(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return frozenset(cls._fields)
    return None


def side(module: str) -> str:
    part = module.split(".")[1] if "." in module else ""
    return "shared" if part in SHARED else "sdk" if part == "client" else "server"


def shapes() -> Iterator[tuple[str, str, frozenset[str]]]:
    """(side, dotted name, field names) of every class with fields the package declares."""
    for info in pkgutil.walk_packages(corral.__path__, "corral."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == info.name:
                names = fields_of(value)
                if names:
                    yield side(info.name), f"{info.name}.{value.__qualname__}", names


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


def test_no_shape_is_declared_on_two_sides() -> None:
    found = list(shapes())
    twice = [
        f"{a} ~ {b}: {sorted(fa ^ fb) or 'the same fields'}"
        for i, (sa, a, fa) in enumerate(found)
        for sb, b, fb in found[i + 1 :]
        if sa != sb and similarity(fa, fb) >= SAME_SHAPE
    ]
    assert not twice, "declare it once in corral.shapes and import it on both sides:\n" + "\n".join(twice)


def test_every_side_is_seen() -> None:
    """The comparison above is not empty: each side's classes are found, with their fields."""
    found = {name: (where, names) for where, name, names in shapes()}
    for cls, where in [
        (SandboxSpecBody, "server"),
        (PoolBody, "server"),
        (TokenRecord, "server"),
        (RetryPolicy, "sdk"),
        (SharedHost, "shared"),
        (SharedSandboxRecord, "shared"),
    ]:
        got = found[f"{cls.__module__}.{cls.__qualname__}"]
        assert got == (where, fields_of(cls)), cls


def test_a_drifted_copy_counts_as_the_same_shape() -> None:
    copy = frozenset(SharedHost.model_fields) - {"address", "runtime"}
    assert similarity(copy, frozenset(SharedHost.model_fields)) >= SAME_SHAPE
    # A record and the answer made of it are different shapes.
    assert similarity(fields_of(TokenRecord) or frozenset(), frozenset(TokenInfo.model_fields)) < SAME_SHAPE


def test_the_sdk_hands_out_the_shared_shapes() -> None:
    assert Host is SharedHost and SandboxRecord is SharedSandboxRecord


def test_the_hot_routes_answer_is_the_shape_field_for_field() -> None:
    """The hot routes answer with ``sandbox_json`` without a validation pass: its keys are the shape's
    fields, and the SDK reads back every value as the server wrote it (oom kills and times included)."""
    record = StoreSandboxRecord(
        id="sb-1",
        tenant_id="tn-1",
        template="default",
        memory_mb=512,
        cpus=1.5,
        name="web",
        host_id="h0",
        state=SandboxState.RUNNING,
        metadata={"a": "b"},
        created_at=1_764_558_716.25,
        expires_at=1_764_558_776.0,
        oom_kills=2,
        warm=True,
        epoch=3,
        recreated_at=1_764_558_720.5,
    )
    sent = sandbox_json(record)
    assert set(sent) == set(SharedSandboxRecord.model_fields)
    read = SharedSandboxRecord.model_validate(sent)
    assert read.model_dump(mode="json") == sent
    assert read.oom_kills == 2 and read.tenant == "tn-1" and read.state == "running"
