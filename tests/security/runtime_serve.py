"""A hostile tenant against a real ``corral serve --runtime process``: one server per test module
(each module's ``serve`` fixture runs :func:`running_serve`), a tenant token to attack it with, and
ways to look at the host underneath."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.runtime.gvisor import unavailable_reason as gvisor_unavailable
from corral.runtime.process import unavailable_reason
from tests.e2e.procs import Proc, free_port, serve_process_args, start, wait_ready

ADMIN_TOKEN = "security-suite-admin-token-0123"


@dataclass
class Serve:
    proc: Proc
    port: int
    state: Path
    tenant: httpx.Client
    admin: httpx.Client

    def create(self, **body: Any) -> str:
        r = self.tenant.post("/v1/sandboxes", json={"memory_mb": 128, **body})
        assert r.status_code == 201, r.text
        return str(r.json()["id"])

    def exec(self, sandbox_id: str, command: list[str] | str, **body: Any) -> dict[str, Any]:
        r = self.tenant.post(f"/v1/sandboxes/{sandbox_id}/exec", json={"command": command, **body})
        assert r.status_code == 200, r.text
        return dict(r.json())

    def exec_python(self, sandbox_id: str, program: str, *args: str) -> Any:
        """Run ``program`` with the sandbox's python3 as the tenant would; what it printed, as JSON."""
        result = self.exec(sandbox_id, ["python3", "-c", program, *args])
        assert result["exit_code"] == 0, result
        return json.loads(result["stdout"])

    def record(self, sandbox_id: str) -> dict[str, Any]:
        """The runtime's record of a sandbox, read on the host (as an operator, not a tenant)."""
        found = list(self.state.glob(f"*/{sandbox_id}/sandbox.json"))
        assert len(found) == 1, found
        return dict(json.loads(found[0].read_text()))

    def init_pid(self, sandbox_id: str) -> int:
        return int(self.record(sandbox_id)["init"]["pid"])

    def delete(self, sandbox_id: str) -> None:
        assert self.tenant.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204


def running_serve(
    tmp_path_factory: pytest.TempPathFactory, runtime: str = "process", hosts: int = 2
) -> Iterator[Serve]:
    reason = unavailable_reason() if runtime == "process" else gvisor_unavailable()
    assert reason is None, f"the {runtime} runtime must work here: {reason}"
    tmp = tmp_path_factory.mktemp("security")
    port = free_port()
    state = tmp / "state"
    args = serve_process_args(port, tmp, runtime=runtime, hosts=hosts)
    proc = start("serve-security", args, tmp, env={"CORRAL_TOKEN": ADMIN_TOKEN})
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        with httpx.Client(
            base_url=proc.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        ) as admin:
            r = admin.post("/v1/tenants", json={"name": "mallory", "max_sandboxes": 50})
            assert r.status_code == 201, r.text
            token = r.json()["token"]
            with httpx.Client(
                base_url=proc.url, headers={"Authorization": f"Bearer {token}"}, timeout=60
            ) as tenant:
                yield Serve(proc, port, state, tenant, admin)
    finally:
        proc.stop()
    # A gvisor host keeps its sandboxes, and runsc its own state, a level down.
    leftovers = [p for p in state.glob("*/*" if runtime == "process" else "*/*/*") if p.is_dir()]
    # A host's network slots keep their lease directory; what must be gone is every lease in it.
    leftovers = [p for p in leftovers if not p.parent.name.endswith(".netslots") or any(p.iterdir())]
    assert not leftovers, f"sandboxes outlived the server: {leftovers}"


def runtime_root(serve: Serve, sandbox_id: str) -> Path:
    """The runtime's root that holds this sandbox's record: ``<state dir>/<host id>``."""
    found = list(serve.state.glob(f"*/{sandbox_id}"))
    assert len(found) == 1, found
    return found[0].parent


def host_pid_ns() -> str:
    return os.readlink("/proc/self/ns/pid")
