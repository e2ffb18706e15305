"""Test doubles for the agent: a runtime whose starts wait for the test to let them finish (to hold starts
in flight without any timing), and the policy and token the tests share."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.core.admission import AdmissionPolicy
from corral.runtime.base import SandboxHandle, SandboxSpec
from corral.runtime.sim import SimRuntime

TOKEN = "s3cret-agent-token"
POLICY = AdmissionPolicy(headroom_mb=2048, reserve_floor_mb=512, reserve_frac=0.25)


class GatedRuntime(SimRuntime):
    """A sim runtime whose starts block until ``open()``: starts stay in flight as long as a test needs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.gate = asyncio.Event()
        self.entered = 0
        self._entered_changed = asyncio.Condition()

    async def start(self, spec: SandboxSpec) -> SandboxHandle:
        async with self._entered_changed:
            self.entered += 1
            self._entered_changed.notify_all()
        await self.gate.wait()
        return await super().start(spec)

    async def wait_entered(self, n: int) -> None:
        async with self._entered_changed:
            await self._entered_changed.wait_for(lambda: self.entered >= n)

    def open(self) -> None:
        self.gate.set()
