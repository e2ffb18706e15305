"""A hostile tenant against a real ``corral serve``, on the process runtime or on gVisor: one server per
test module and runtime (each module's ``serve`` fixture runs :func:`running_serve` with the suite's
``runtime_name``), a tenant token to attack it with, and ways to look at the host underneath, the same
for both runtimes where they differ (where a sandbox's record and cgroups are, which host processes
are its own)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.runtime.cgroups import SandboxCgroup, detect
from corral.runtime.gvisor import unavailable_reason as gvisor_unavailable
from corral.runtime.process import unavailable_reason
from tests.e2e.procs import Proc, free_port, serve_process_args, start, wait_ready

ADMIN_TOKEN = "security-suite-admin-token-0123"
RUNTIMES = ("process", "gvisor")


@dataclass
class Serve:
    proc: Proc
    port: int
    state: Path
    tenant: httpx.Client
    admin: httpx.Client
    runtime: str = "process"

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

    @property
    def gvisor(self) -> bool:
        return self.runtime == "gvisor"

    def record(self, sandbox_id: str) -> dict[str, Any]:
        """The runtime's record of a sandbox, read on the host (as an operator, not a tenant)."""
        return dict(json.loads((self.home(sandbox_id) / "sandbox.json").read_text()))

    def home(self, sandbox_id: str) -> Path:
        """The sandbox's directory: ``<state>/<host id>/<id>``, a gvisor host's a level down."""
        found = list(self.state.glob(f"*/sandboxes/{sandbox_id}" if self.gvisor else f"*/{sandbox_id}"))
        assert len(found) == 1, found
        return found[0]

    def cgroup_dirs(self, sandbox_id: str) -> list[Path]:
        """The sandbox's cgroups: its memory one first, then (on v1) its cpu, pids and freezer twins."""
        if self.gvisor:
            # The runtime's naming (corral.control.localfleet): <root>/<host id>-gv-<id>.
            host = self.home(sandbox_id).parent.parent.name
            root = detect()
            assert root is not None
            cgroup: SandboxCgroup = root.child(f"{host}-gv-{sandbox_id}")
            return [cgroup.path, *cgroup.extra]
        record = self.record(sandbox_id)
        return [Path(record["cgroup"]), *(Path(p) for p in record.get("cgroup_extra", []))]

    def host_pids(self, sandbox_id: str) -> list[int]:
        """Every host process the runtime runs for the sandbox (for gVisor: the Sentry, its gofer and
        the platform's stubs)."""
        return [int(pid) for pid in (self.cgroup_dirs(sandbox_id)[0] / "cgroup.procs").read_text().split()]

    def init_pid(self, sandbox_id: str) -> int:
        """The host pid that holds the sandbox's pid 1: its init, or on gVisor the Sentry that runs it."""
        if self.gvisor:
            sentries = [p for p in self.host_pids(sandbox_id) if _cmdline(p).startswith(b"runsc-sandbox")]
            assert len(sentries) == 1, sentries
            return sentries[0]
        return int(self.record(sandbox_id)["init"]["pid"])

    def delete(self, sandbox_id: str) -> None:
        assert self.tenant.delete(f"/v1/sandboxes/{sandbox_id}").status_code == 204

    def wait_stopped(self, sandbox_id: str) -> None:
        """Until the API reports the sandbox stopped (it ended on its own; its agent noticed)."""
        deadline = time.monotonic() + 30
        while (state := self.tenant.get(f"/v1/sandboxes/{sandbox_id}").json()["state"]) != "stopped":
            assert time.monotonic() < deadline, f"still {state}"
            time.sleep(0.2)


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
                yield Serve(proc, port, state, tenant, admin, runtime)
    finally:
        proc.stop()
    # A gvisor host keeps its sandboxes, and runsc its own state, a level down.
    leftovers = [p for p in state.glob("*/*" if runtime == "process" else "*/*/*") if p.is_dir()]
    # A host's network slots keep their lease directory; what must be gone is every lease in it.
    leftovers = [p for p in leftovers if not p.parent.name.endswith(".netslots") or any(p.iterdir())]
    assert not leftovers, f"sandboxes outlived the server: {leftovers}"


def runtime_root(serve: Serve, sandbox_id: str) -> Path:
    """The runtime's root that holds this sandbox's record: ``<state dir>/<host id>``."""
    home = serve.home(sandbox_id)
    return home.parent.parent if serve.gvisor else home.parent


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def host_pid_ns() -> str:
    return os.readlink("/proc/self/ns/pid")
