"""A template's start command and ready check, run at create (E2B's semantics): the start command
runs in the background from the sandbox's start, and the sandbox is ready when the ready command
exits 0. A create answers once its sandbox is ready; one whose ready check has not passed within the
bound is refused (``sandbox_not_ready``, with the check's last output) and its sandbox removed, so a
create never hands out a sandbox its template says is not ready.

Run by the create itself, after placement and outside its create slot: a slow ready check holds no
slot another create waits for. A warm sandbox runs its start command when it is claimed (its pool
booted it before anyone asked). A batch waits for all its sandboxes, and is refused whole (every
sandbox of it removed) when one of them does not get ready. A sandbox the leader recreates after its
host died (failover ``recreate``) runs its start command again on its new host; no one waits there
for its ready check (no create is waiting).
"""

from __future__ import annotations

import asyncio
import logging

from corral.agent.protocol import ExecRequest
from corral.control.errors import ResourceNotFound, SandboxNotReady
from corral.control.sandboxes import Sandboxes
from corral.control.templates import Templates
from corral.exec_result import MAX_EXEC_TIMEOUT_S, ExecResult
from corral.images.config import ImageConfig
from corral.store import SandboxRecord, SandboxState

log = logging.getLogger("corral.control.readiness")

DEFAULT_READY_TIMEOUT_S = 60.0
# Start and ready commands this replica runs at once, across every create it waits on: the work is the
# control plane's own, so it counts against no tenant's data-plane slots, and is bounded here instead.
MAX_CHECKS_IN_FLIGHT = 64
READY_POLL_S = 0.2
CHECK_TIMEOUT_S = 10.0  # one run of the ready command
TAIL_CHARS = 2000


def _shell(command: str) -> list[str]:
    return ["/bin/sh", "-c", command]


class Readiness:
    def __init__(
        self, sandboxes: Sandboxes, templates: Templates, timeout_s: float = DEFAULT_READY_TIMEOUT_S
    ) -> None:
        self.sandboxes = sandboxes
        self.templates = templates
        self.timeout_s = timeout_s
        self._in_flight = asyncio.Semaphore(MAX_CHECKS_IN_FLIGHT)

    async def start(self, record: SandboxRecord) -> ImageConfig | None:
        """The start command started (if the template has one); the config, when it has a ready check."""
        config = await self.templates.image_config(record)
        if config is None:
            return None
        if config.start_cmd:
            req = ExecRequest(command=_shell(config.start_cmd), timeout_s=MAX_EXEC_TIMEOUT_S)
            async with self._in_flight:
                # As the control plane (no tenant): a tenant busy with its own execs still gets the
                # sandbox it asked for; the record was just made for that tenant.
                await self.sandboxes.start_command(record.id, None, req)
        return config if config.ready_cmd else None

    async def settle(self, record: SandboxRecord) -> None:
        """Start the sandbox's start command and wait for its ready check; a sandbox that does not get
        ready within the bound (or whose start fails) is removed, and the create refused."""
        try:
            config = await self.start(record)
            if config is not None and config.ready_cmd:
                await self._ready(record, config.ready_cmd)
        except BaseException:
            # Shielded: a caller gone mid-wait still leaves no sandbox behind.
            await asyncio.shield(self.remove(record))
            raise

    async def replayed(self, record: SandboxRecord) -> None:
        """A create answered again (its Idempotency-Key) waits, as the first answer does, for the ready
        check, without starting the start command again or removing anything: the first create runs
        and removes. A sandbox removed meanwhile (the first create's check failed) is not ready; one
        no longer running (stopped or deleted since) is answered as it is, as before."""
        if record.state != SandboxState.RUNNING:
            return
        config = await self.templates.image_config(record)
        if config is None or not config.ready_cmd:
            return
        try:
            await self._ready(record, config.ready_cmd)
        except ResourceNotFound:
            raise SandboxNotReady(
                f"template {record.template!r}'s ready check did not pass; the sandbox was removed",
                details={
                    "template": record.template,
                    "ready_cmd": config.ready_cmd,
                    "timeout_s": self.timeout_s,
                },
            ) from None

    async def settle_all(self, records: list[SandboxRecord]) -> None:
        """:meth:`settle` of each at once; when one fails, every one is removed and its error raised."""
        results = await asyncio.gather(*(self.settle(r) for r in records), return_exceptions=True)
        failed = [r for r in results if isinstance(r, BaseException)]
        if failed:
            await asyncio.shield(asyncio.gather(*(self.remove(r) for r in records)))
            raise failed[0]

    async def _ready(self, record: SandboxRecord, ready_cmd: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        last: ExecResult | None = None
        while True:
            left = deadline - loop.time()
            if left <= 0:
                break
            req = ExecRequest(command=_shell(ready_cmd), timeout_s=max(0.1, min(CHECK_TIMEOUT_S, left)))
            async with self._in_flight:
                result = await self.sandboxes.exec(record.id, None, req)
            if result.exit_code == 0:
                return
            if last is None or not result.timed_out:  # a run the deadline cut short says less
                last = result
            await asyncio.sleep(min(READY_POLL_S, max(0.0, deadline - loop.time())))
        output = ((last.stdout + last.stderr) if last is not None else "")[-TAIL_CHARS:]
        raise SandboxNotReady(
            f"template {record.template!r}'s ready check did not pass within {self.timeout_s:g} s; "
            "the sandbox was removed",
            details={
                "template": record.template,
                "ready_cmd": ready_cmd,
                "exit_code": last.exit_code if last is not None else None,
                "output": output,
                "timeout_s": self.timeout_s,
            },
        )

    async def remove(self, record: SandboxRecord) -> None:
        try:
            await self.sandboxes.delete(record.id, None, forget_idempotency=True)
        except ResourceNotFound:
            pass  # removed already (settle's own failure)
        except Exception:
            # Its record stays: the reconciler ends what the store and its host still hold.
            log.warning("sandbox %s did not get ready and could not be removed now", record.id, exc_info=True)
