"""A template's start and ready commands are the control plane's own work: they run whatever the
tenant's own data-plane calls hold, and a replica runs a bounded number of them at once."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.agent.protocol import ExecRequest
from corral.control.readiness import MAX_CHECKS_IN_FLIGHT, Readiness
from corral.exec_result import ExecResult
from corral.images.config import ImageConfig
from corral.store import SandboxRecord


class _Templates:
    async def image_config(self, record: SandboxRecord) -> ImageConfig:
        return ImageConfig(start_cmd="serve", ready_cmd="ready")


class _Sandboxes:
    """Records on whose behalf each command runs, and how many run at once."""

    def __init__(self) -> None:
        self.callers: list[str | None] = []
        self.running = 0
        self.most = 0
        self.removed: list[str] = []

    async def _run(self, tenant_id: str | None) -> None:
        self.callers.append(tenant_id)
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.01)
        self.running -= 1

    async def start_command(self, sandbox_id: str, tenant_id: str | None, req: ExecRequest) -> None:
        await self._run(tenant_id)

    async def exec(self, sandbox_id: str, tenant_id: str | None, req: ExecRequest) -> ExecResult:
        await self._run(tenant_id)
        return ExecResult(exit_code=0, stdout="", stderr="", duration_s=0.0)

    async def delete(self, sandbox_id: str, tenant_id: str | None, **_: Any) -> None:
        self.removed.append(sandbox_id)


def _record(i: int) -> SandboxRecord:
    return SandboxRecord(
        id=f"sb-{i}", tenant_id="t-busy", template="app", memory_mb=256, cpus=1, image="sha256:" + "0" * 64
    )


async def test_a_batch_s_checks_take_no_tenant_slot_and_are_bounded_per_replica() -> None:
    sandboxes = _Sandboxes()
    ready = Readiness(sandboxes, _Templates())  # type: ignore[arg-type]
    await ready.settle_all([_record(i) for i in range(3 * MAX_CHECKS_IN_FLIGHT)])
    # Not the tenant's calls: a tenant whose own execs fill its slots still gets its sandboxes.
    assert set(sandboxes.callers) == {None}
    assert len(sandboxes.callers) == 2 * 3 * MAX_CHECKS_IN_FLIGHT  # a start and a check each
    assert sandboxes.most <= MAX_CHECKS_IN_FLIGHT
    assert sandboxes.removed == []
