"""One structured log line per request, with a request id honoured or generated and echoed back."""

from __future__ import annotations

import io
import json
import logging
import re

import httpx
import pytest

from corral.client import Corral
from corral.client.errors import NotFound
from corral.logs import JsonFormatter, TextFormatter, formatter_for

from .conftest import ADMIN, Cluster, make_cluster


def lines(caplog: pytest.LogCaptureFixture) -> list[dict]:  # type: ignore[type-arg]
    fmt = JsonFormatter()
    return [json.loads(fmt.format(r)) for r in caplog.records if r.name == "corral.request"]


async def test_a_create_logs_its_decision_under_the_callers_request_id(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="corral.request")
    r = await cluster.http.post(
        "/v1/sandboxes",
        json={"env": {"API_KEY": "env-value-never-logged"}},
        headers={**cluster.as_(ADMIN), "X-Request-Id": "trace-7f3a:client-1"},
    )
    assert r.status_code == 201 and r.headers["x-request-id"] == "trace-7f3a:client-1"
    (line,) = lines(caplog)
    assert line["request_id"] == "trace-7f3a:client-1"
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/sandboxes", 201)
    assert line["outcome"] == "placed" and line["host"] == r.json()["host_id"]
    assert line["sandbox_id"] == r.json()["id"] and line["create_ms"] >= 0 and line["ms"] >= 0
    assert line["replica"] == "replica-test"
    text = "\n".join(JsonFormatter().format(x) for x in caplog.records)
    assert ADMIN not in text and "env-value-never-logged" not in text and "API_KEY" not in text


@pytest.mark.parametrize("bad", ["x" * 129, "has space", "new\nline", "ünicode", "", "tab\there", "a\x00b"])
async def test_an_insane_request_id_is_replaced(
    cluster: Cluster, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    caplog.set_level(logging.INFO, logger="corral.request")
    raw = [(b"authorization", f"Bearer {ADMIN}".encode()), (b"x-request-id", bad.encode())]
    r = await cluster.http.get("/v1/hosts", headers=raw)
    assert r.status_code == 200
    rid = r.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{16}", rid), rid
    assert lines(caplog)[-1]["request_id"] == rid


async def test_each_request_gets_its_own_generated_id(cluster: Cluster) -> None:
    ids = {(await cluster.http.get("/healthz")).headers["x-request-id"] for _ in range(5)}
    assert len(ids) == 5


async def test_a_refusal_logs_its_code(tmp_path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    c = await make_cluster(tmp_path, hosts=1, memory_mb=4096)
    try:
        caplog.set_level(logging.INFO, logger="corral.request")
        r = await c.http.post(
            "/v1/sandboxes", json={"memory_mb": 4096, "stateful": True}, headers=c.as_(ADMIN)
        )  # as large as the host: no room beside its headroom
        assert r.status_code == 503
        line = lines(caplog)[-1]
        assert line["status"] == 503 and line["outcome"] == "no_capacity"
        assert line["reasons"] == {"does_not_fit": 1}
        assert line["request_id"] == r.headers["x-request-id"]
    finally:
        await c.http.aclose()
        await c.plane.stop()
        await c.plane.store.close()


def test_the_sdk_sends_a_request_id_and_names_it_in_errors() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers["x-request-id"])
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no sandbox sb-1"}})

    with Corral("http://corral.test", "t0k", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(NotFound) as info:
            client.sandboxes.get("sb-1")
        with pytest.raises(NotFound):
            client.sandboxes.get("sb-1")
    assert len(set(seen)) == 2 and all(re.fullmatch(r"[0-9a-f]{32}", s) for s in seen)
    assert info.value.request_id == seen[0] and seen[0] in str(info.value)


def test_formats() -> None:
    rec = logging.LogRecord("corral.request", logging.INFO, __file__, 1, "request", None, None)
    rec.fields = {"request_id": "r1", "status": 201, "reasons": {"does_not_fit": 2}}
    out = json.loads(JsonFormatter().format(rec))
    assert out["msg"] == "request" and out["request_id"] == "r1" and out["status"] == 201
    text = TextFormatter().format(rec)
    assert "request_id=r1" in text and "status=201" in text and "\n" not in text
    assert isinstance(formatter_for("auto", io.StringIO()), JsonFormatter)
    assert isinstance(formatter_for("text", io.StringIO()), TextFormatter)
    with pytest.raises(ValueError):
        formatter_for("xml", io.StringIO())
