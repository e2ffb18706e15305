"""The routes of both APIs that name something in their path, read from the apps themselves (corral's
OpenAPI description, the E2B router's), each with a body that passes validation, so a test can call
every one of them, including routes added later."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI

from corral.api.e2b import control

# A valid body for each request schema a route declares, so the call reaches the handler's lookup
# instead of stopping at validation (where any id would answer alike). A route with a new body schema
# fails the tests that use this table until it gets an example here.
EXAMPLE_BODIES: dict[str, Any] = {
    "ExecBody": {"command": ["true"]},
    "CommandBody": {"command": ["true"]},
    "Timeout": {"timeout": 30},
    "PoolPatch": {"size": 1},
    "QuotaBody": {"max_cpus": 8},
    "EgressPolicyBody": {"mode": "none"},
    "DomainBody": {"hostname": "app.example.test", "port": 8080},
    "BuildBody": {"recipe": "FROM debian:bookworm\nRUN true\n"},
}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # with {param} placeholders
    params: tuple[str, ...]
    body: Any  # None: no body


def operations(app: FastAPI) -> list[Operation]:
    """Every operation of ``app`` with a path parameter, as its OpenAPI description declares it."""
    found = []
    for path, ops in app.openapi()["paths"].items():
        for method, op in ops.items():
            params = tuple(p["name"] for p in op.get("parameters", []) if p["in"] == "path")
            if not params:
                continue
            schema = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            body: Any = None
            if schema is not None:
                ref = schema.get("$ref", "").rpartition("/")[2]
                if ref:
                    assert ref in EXAMPLE_BODIES, f"{method} {path}: add an example {ref} to EXAMPLE_BODIES"
                    body = EXAMPLE_BODIES[ref]
                else:
                    assert schema.get("type") == "object", (method, path, schema)
                    body = {}
            found.append(Operation(method.upper(), path, params, body))
    return found


def e2b_app() -> FastAPI:
    app = FastAPI()
    app.include_router(control.router)
    return app
