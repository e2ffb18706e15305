"""An in-memory stand-in for the corral HTTP API, served through ``httpx.MockTransport``, and a fake
clock whose ``sleep`` advances it. Both are the seams the SDK offers; nothing is monkeypatched."""

from __future__ import annotations

import itertools
import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class FakeTime:
    """A monotonic clock that only moves when slept on (or when the fake server charges latency)."""

    now: float = 1000.0
    sleeps: list[float] = field(default_factory=list)

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0, seconds
        self.sleeps.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def refusal(
    status: int,
    code: str | None,
    *,
    retry_after: float | None = None,
    header: bool = True,
    details: dict[str, Any] | None = None,
) -> httpx.Response:
    """An error response in the API's shape (``code=None`` sends a bare status, like a proxy would)."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None and header else {}
    if code is None:
        return httpx.Response(status, headers=headers, text="upstream trouble")
    error: dict[str, Any] = {"code": code, "message": f"{code} (fake)", "details": details or {}}
    if retry_after is not None:
        error["retry_after_s"] = retry_after
    return httpx.Response(status, headers=headers, json={"error": error})


class FakeApi:
    """Enough of the API for the SDK: sandboxes CRUD with idempotency, exec, paged listing, hosts.

    ``create_script`` holds what the next creates answer *before* normal handling: an
    ``httpx.Response`` (a refusal), or an exception instance to raise (a transport failure). Every
    request is recorded in ``requests``.
    """

    def __init__(
        self,
        hosts: tuple[str, ...] = ("h1", "h2", "h3"),
        *,
        place: Callable[[int], str] | None = None,
        page_size: int = 2,
        time: FakeTime | None = None,
        request_cost_s: float = 0.0,
        hosts_status: int = 200,
    ) -> None:
        self.hosts = hosts
        self.place = place or (lambda i: hosts[i % len(hosts)])
        self.page_size = page_size
        self.time = time
        self.request_cost_s = request_cost_s
        self.hosts_status = hosts_status
        self.sandboxes: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.drained: dict[str, bool] = {}
        self.by_key: dict[str, str] = {}
        self.create_script: deque[httpx.Response | Exception] = deque()
        self.delete_script: deque[httpx.Response] = deque()
        self.requests: list[httpx.Request] = []
        self._ids = itertools.count(1)

    @property
    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def create_requests(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == "POST" and r.url.path == "/v1/sandboxes"]

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.time is not None:
            self.time.now += self.request_cost_s
        path = request.url.path
        parts = path.strip("/").split("/")
        if request.headers.get("Authorization") != "Bearer t0k":
            return refusal(401, "unauthorized")
        if path == "/v1/sandboxes" and request.method == "POST":
            return self._create(request)
        if path == "/v1/sandboxes" and request.method == "GET":
            return self._list(request)
        if path == "/v1/hosts" and request.method == "GET":
            if self.hosts_status != 200:
                return refusal(self.hosts_status, "forbidden")
            return httpx.Response(200, json={"hosts": [self._host(h) for h in self.hosts]})
        if parts[:2] == ["v1", "hosts"] and len(parts) == 4 and parts[3] in ("drain", "undrain"):
            if parts[2] not in self.hosts:
                return refusal(404, "not_found")
            self.drained[parts[2]] = parts[3] == "drain"
            return httpx.Response(
                200, json={"id": parts[2], "state": "draining" if self.drained[parts[2]] else "ready"}
            )
        if parts[:2] == ["v1", "sandboxes"] and len(parts) >= 3:
            sandbox = self.sandboxes.get(parts[2])
            if sandbox is None:
                return refusal(404, "not_found")
            if len(parts) == 3 and request.method == "GET":
                return httpx.Response(200, json=sandbox)
            if len(parts) == 3 and request.method == "DELETE":
                if self.delete_script:
                    return self.delete_script.popleft()
                del self.sandboxes[parts[2]]
                self.deleted.append(parts[2])
                return httpx.Response(204)
            if parts[3:] == ["exec"] and request.method == "POST":
                body = json.loads(request.content)
                command = body["command"]
                out = " ".join(command) if isinstance(command, list) else command
                return httpx.Response(
                    200, json={"exit_code": 3, "stdout": out + "\n", "stderr": "err\n", "duration_ms": 12.5}
                )
            if parts[3:] == ["exec", "stream"] and request.method == "POST":
                command = json.loads(request.content)["command"]
                out = " ".join(command) if isinstance(command, list) else command
                lines = [{"stdout": out + "\n"}, {}, {"stderr": "err\n"}]
                lines.append({"result": {"exit_code": 3, "duration_ms": 12.5}})
                return httpx.Response(200, content="".join(json.dumps(x) + "\n" for x in lines))
        return refusal(404, "not_found")

    def _create(self, request: httpx.Request) -> httpx.Response:
        if self.create_script:
            scripted = self.create_script.popleft()
            if isinstance(scripted, Exception):
                raise scripted
            return scripted
        key = request.headers.get("Idempotency-Key")
        if key is not None and key in self.by_key:
            return httpx.Response(201, json=self.sandboxes[self.by_key[key]])
        body = json.loads(request.content)
        n = next(self._ids)
        sandbox = {
            "id": f"sb-{n}",
            "name": body.get("name"),
            "tenant": "acme",
            "template": body["template"],
            "host_id": self.place(n - 1),
            "state": "running",
            "memory_mb": body.get("memory_mb", 512),
            "cpus": body.get("cpus", 1.0),
            "stateful": body.get("stateful", False),
            "metadata": body.get("metadata", {}),
            "created_at": "2026-11-30T08:00:00Z",
            "expires_at": "2026-11-30T08:05:00+00:00",
        }
        self.sandboxes[sandbox["id"]] = sandbox
        if key is not None:
            self.by_key[key] = sandbox["id"]
        return httpx.Response(201, json=sandbox)

    def _list(self, request: httpx.Request) -> httpx.Response:
        params = request.url.params
        rows = [
            s
            for s in self.sandboxes.values()
            if params.get("state") in (None, s["state"]) and params.get("host_id") in (None, s["host_id"])
        ]
        limit = int(params.get("limit", self.page_size))
        start = int(params.get("cursor", "0"))
        page = rows[start : start + limit]
        nxt = str(start + limit) if start + limit < len(rows) else None
        return httpx.Response(200, json={"sandboxes": page, "next_cursor": nxt})

    def _host(self, host_id: str) -> dict[str, Any]:
        n = sum(1 for s in self.sandboxes.values() if s["host_id"] == host_id)
        return {
            "id": host_id,
            "state": "ready",
            "heartbeat_age_s": 1.5,
            "cpu_total": 8,
            "cpu_used": 1.5,
            "memory_mb_total": 32768,
            "memory_mb_used": 512 * n,
            "memory_mb_admittable": 30000 - 512 * n,
            "memory_admission": "working-set",
            "reserved_mb": 0,
            "sandboxes": n,
        }
