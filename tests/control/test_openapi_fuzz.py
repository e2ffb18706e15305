"""Fuzzing every operation of the API from its own OpenAPI description (schemathesis), in process.

Each operation gets cases that match its schema and cases that break it, sent as the admin, as a
tenant (a hostile one: it probes routes that are not its own) or, on the agent routes, as an enrolled
host. Every response must: be no 5xx but a 503 that says when to retry;
carry every error in the one error shape; match the status, content type and schema the description
declares. ``CORRAL_FUZZ_EXAMPLES`` sets the cases per operation and mode (``make fuzz`` runs many).
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from .conftest import ADMIN, Cluster, Send, run_beside_cluster

EXAMPLES = int(os.environ.get("CORRAL_FUZZ_EXAMPLES", "8"))
CODE = re.compile(r"^[a-z][a-z0-9_]*$")


def error_shape_problem(r: httpx.Response) -> str | None:
    """What is wrong with an error response, if anything."""
    if r.status_code >= 500 and r.status_code != 503:
        return f"server error {r.status_code}"
    try:
        body = r.json()
    except ValueError:
        return "error body is not JSON"
    if not isinstance(body, dict) or set(body) != {"error"} or not isinstance(body["error"], dict):
        return "body is not {'error': {...}}"
    err: dict[str, Any] = body["error"]
    if set(err) != {"code", "message", "retry_after_s", "details"}:
        return f"error keys {sorted(err)}"
    if not isinstance(err["code"], str) or not CODE.match(err["code"]):
        return f"code {err['code']!r}"
    if not isinstance(err["message"], str) or not isinstance(err["details"], dict):
        return "message or details of the wrong type"
    retry = err["retry_after_s"]
    if retry is not None and not (isinstance(retry, int) and retry >= 1):
        return f"retry_after_s {retry!r}"
    if r.status_code == 503 and (retry is None or r.headers.get("Retry-After") != str(retry)):
        return "a 503 without a Retry-After matching retry_after_s"
    return None


CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def fuzz_operation(op: Any, mode: GenerationMode, tokens: list[str], send: Send) -> int:
    """Run one operation's cases in one mode; the number of requests sent."""
    sent = 0

    @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=op.as_strategy(generation_mode=mode), token=st.sampled_from(tokens))
    def probe(case: Any, token: str) -> None:
        nonlocal sent
        kw = case.as_transport_kwargs(
            base_url="http://corral.test", headers={"Authorization": f"Bearer {token}"}
        )
        request = {k: kw[k] for k in ("method", "url", "headers", "params") if k in kw}
        if "json" in kw:
            request["json"] = kw["json"]
        elif "data" in kw:
            request["content"] = kw["data"]
        r = send(request)
        sent += 1
        if r.status_code >= 400:
            problem = error_shape_problem(r)
            assert problem is None, f"{problem}: {r.status_code} {r.text[:300]}"
        case.validate_response(r, checks=CHECKS)

    with contextlib.suppress(Unsatisfiable):  # nothing to break in an operation without parameters
        probe()
    return sent


def test_every_operation_holds_to_its_description(tmp_path: Path) -> None:
    failures: list[str] = []
    sent = 0
    tokens: dict[str, str] = {}

    async def enrol(c: Cluster) -> None:
        tokens["agent"] = (await c.plane.enrol_host(c.fleet.agents[0].id)).agent_token
        _, tokens["tenant"] = await c.plane.create_tenant("fuzz", max_sandboxes=4, max_memory_mb=8192)

    def fuzz(c: Cluster, send: Send) -> None:
        nonlocal sent
        app = c.http._transport.app  # type: ignore[attr-defined]
        operations = [r.ok() for r in schemathesis.openapi.from_dict(app.openapi()).get_all_operations()]
        assert len(operations) >= 25
        for op in operations:
            role = "agent" if op.path.startswith("/v1/agent/") else "tenant"
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                try:
                    sent += fuzz_operation(op, mode, [ADMIN, tokens[role]], send)
                except BaseException as e:  # schemathesis reports a group of failures
                    failures.append(f"{op.label} ({mode.value}): {e}"[:2000])

    run_beside_cluster(tmp_path, fuzz, setup=enrol, hosts=2)
    assert not failures, "\n\n".join(failures)
    assert sent >= 25 * EXAMPLES // 2


def test_the_description_declares_the_error_shape(tmp_path: Path) -> None:
    """Every operation declares its errors in corral's shape, not FastAPI's validation shape."""

    docs: list[dict[str, Any]] = []
    run_beside_cluster(
        tmp_path, lambda _, send: docs.append(send({"method": "GET", "url": "/openapi.json"}).json()), hosts=1
    )
    doc = docs[0]
    assert "HTTPValidationError" not in str(doc)
    error = doc["components"]["schemas"]["ErrorBody"]
    assert error["required"] == ["error"]
    detail = doc["components"]["schemas"]["ErrorDetail"]
    assert set(detail["required"]) == {"code", "message", "retry_after_s", "details"}
    for path, item in doc["paths"].items():
        for method, op in item.items():
            ref = op["responses"]["default"]["content"]["application/json"]["schema"]["$ref"]
            assert ref.endswith("/ErrorBody"), (method, path)
    metrics = doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
    assert list(metrics) == ["text/plain"]
