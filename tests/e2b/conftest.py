"""The real ``e2b`` SDK against a real ``corral serve --runtime process``: one server for the module,
two tenants, the SDK pointed at corral by its two environment variables."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox

from corral.runtime.process import unavailable_reason
from corral.testing.images import cache_dir
from tests.e2e.procs import free_port, serve_process_args, start, wait_ready

ADMIN_TOKEN = "e2b-suite-admin-token-0123456"


@dataclass
class Corral:
    url: str
    key: str  # tenant alice
    other_key: str  # tenant bob
    admin: httpx.Client
    alice_id: str
    workdir: Path  # the server's store, state and blobs are under it


@pytest.fixture(scope="session")
def corral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Corral]:
    reason = unavailable_reason()
    assert reason is None, f"the process runtime must work here: {reason}"
    tmp = tmp_path_factory.mktemp("e2b")
    port = free_port()
    # Template builds take their base from the test cache (the small base, made once per machine) and
    # may use the network (apt, pip): the build tests' own choice, see tests/e2b/test_templates.py.
    builds = ["--bases-dir", str(cache_dir()), "--build-network"]
    args = [*serve_process_args(port, tmp), *builds]
    proc = start("serve-e2b", args, tmp, env={"CORRAL_TOKEN": ADMIN_TOKEN})
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}")
        with httpx.Client(base_url=proc.url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
            keys, ids = [], []
            for name in ("alice", "bob"):
                # 120: `make e2b-listing` lists 100 of alice's at once.
                r = admin.post("/v1/tenants", json={"name": name, "max_sandboxes": 120})
                assert r.status_code == 201, r.text
                keys.append(r.json()["token"])
                ids.append(r.json()["id"])
            yield Corral(proc.url, keys[0], keys[1], admin, ids[0], tmp)
    finally:
        proc.stop()


@pytest.fixture
def sdk_env(corral: Corral, monkeypatch: pytest.MonkeyPatch) -> Corral:
    monkeypatch.setenv("E2B_API_URL", corral.url)
    monkeypatch.setenv("E2B_SANDBOX_URL", corral.url)
    monkeypatch.setenv("E2B_API_KEY", corral.key)
    return corral


@pytest.fixture
def sandbox(sdk_env: Corral) -> Iterator[Sandbox]:
    """A sandbox of tenant alice's, killed after the test."""
    sb = Sandbox.create(metadata={"suite": "e2b"})
    yield sb
    sb.kill()
