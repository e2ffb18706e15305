"""``corral serve`` with real sandboxes: create, exec, kill, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from corral.runtime.cgroups import detect
from corral.runtime.process import unavailable_reason

from .procs import free_port, serve_process_args, start, wait_ready

pytestmark = pytest.mark.process

TOKEN = "e2e-process-admin-token-0123"


def cgroup_pids(cgroup_dir: Path) -> list[int]:
    return [int(p) for p in (cgroup_dir / "cgroup.procs").read_text().split()]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_process_runtime_end_to_end(tmp_path: Path) -> None:
    reason = unavailable_reason()
    assert reason is None, f"the process runtime must work here: {reason}"
    port = free_port()
    state = tmp_path / "state"
    proc = start("serve-process", serve_process_args(port, tmp_path), tmp_path, env={"CORRAL_TOKEN": TOKEN})
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        with httpx.Client(base_url=proc.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30) as c:
            r = c.post("/v1/sandboxes", json={"memory_mb": 256})
            assert r.status_code == 201, r.text
            sb = r.json()
            sid = sb["id"]
            assert sb["state"] == "running" and sb["host_id"] in {"host-01", "host-02"}
            ex = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["hostname"]})
            assert ex.status_code == 200 and ex.json()["stdout"].strip() == sid
            ex = c.post(f"/v1/sandboxes/{sid}/exec", json={"command": "echo hello from $(hostname)"})
            assert ex.json() == {**ex.json(), "exit_code": 0, "stdout": f"hello from {sid}\n"}
            # it sees its own processes only
            ps = c.post(
                f"/v1/sandboxes/{sid}/exec", json={"command": ["sh", "-c", "ls /proc | grep -c '^[0-9]'"]}
            )
            assert int(ps.json()["stdout"]) < 10
            cgroups = detect()
            assert cgroups is not None
            dirs = [p for p in cgroups.path.rglob(f"*{sid}") if p.is_dir()]  # each host prefixes its own
            assert len(dirs) == 1, "one memory cgroup per sandbox"
            pids = cgroup_pids(dirs[0])
            assert pids and all(alive(p) for p in pids), "the sandbox runs as real processes here"
            limit = dirs[0] / "memory.limit_in_bytes"
            if limit.exists():
                assert int(limit.read_text()) == 256 * 1024 * 1024
            assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
            assert c.get(f"/v1/sandboxes/{sid}").status_code == 404
        assert not any(alive(p) for p in pids), "no process of the sandbox may outlive its deletion"
        assert not list(cgroups.path.rglob(f"*{sid}")), "nor its cgroup"
        assert not list(state.rglob(sid)), "nor its state"
    finally:
        proc.stop()
