"""A sandbox handle: its last known record plus the verbs that act on it. The sync and async handles
share the read side (``SandboxView``); only the verbs differ in colour."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any

from corral.client.errors import NotFound
from corral.client.models import ExecResult, SandboxRecord
from corral.client.retry import CreateStats

if TYPE_CHECKING:
    from corral.client.async_client import AsyncSandboxes
    from corral.client.client import Sandboxes


class SandboxView:
    """Read-only fields of the last record the server sent. ``refresh()`` fetches a newer one."""

    __slots__ = ("_record", "create_stats")

    def __init__(self, record: SandboxRecord, create_stats: CreateStats | None = None) -> None:
        self._record = record
        # Set only on the handle a create returned: what it took to get a placement.
        self.create_stats = create_stats

    @property
    def record(self) -> SandboxRecord:
        return self._record

    @property
    def id(self) -> str:
        return self._record.id

    @property
    def name(self) -> str | None:
        return self._record.name

    @property
    def tenant(self) -> str | None:
        return self._record.tenant

    @property
    def template(self) -> str:
        return self._record.template

    @property
    def host_id(self) -> str | None:
        return self._record.host_id

    @property
    def state(self) -> str:
        return self._record.state

    @property
    def memory_mb(self) -> int | None:
        return self._record.memory_mb

    @property
    def cpus(self) -> float | None:
        return self._record.cpus

    @property
    def stateful(self) -> bool:
        return self._record.stateful

    @property
    def warm(self) -> bool:
        """Taken from a warm pool rather than started for this create."""
        return self._record.warm

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._record.metadata)

    @property
    def created_at(self) -> datetime | None:
        return self._record.created_at

    @property
    def expires_at(self) -> datetime | None:
        return self._record.expires_at

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, host_id={self.host_id!r}, state={self.state!r})"


class Sandbox(SandboxView):
    """A sandbox, for the blocking client. ``with`` kills it on exit (already gone is fine)."""

    __slots__ = ("_api",)

    def __init__(
        self, record: SandboxRecord, api: Sandboxes, create_stats: CreateStats | None = None
    ) -> None:
        super().__init__(record, create_stats)
        self._api = api

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        return self._api.exec(self.id, command, timeout_s=timeout_s, env=env, cwd=cwd)

    def kill(self) -> None:
        self._api.delete(self.id)

    def refresh(self) -> Sandbox:
        self._record = self._api.get(self.id).record
        return self

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(NotFound):  # already gone: the goal of the exit is reached
            self.kill()


class AsyncSandbox(SandboxView):
    """A sandbox, for the asyncio client. ``async with`` kills it on exit (already gone is fine)."""

    __slots__ = ("_api",)

    def __init__(
        self, record: SandboxRecord, api: AsyncSandboxes, create_stats: CreateStats | None = None
    ) -> None:
        super().__init__(record, create_stats)
        self._api = api

    async def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        return await self._api.exec(self.id, command, timeout_s=timeout_s, env=env, cwd=cwd)

    async def kill(self) -> None:
        await self._api.delete(self.id)

    async def refresh(self) -> AsyncSandbox:
        self._record = (await self._api.get(self.id)).record
        return self

    async def __aenter__(self) -> AsyncSandbox:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        with contextlib.suppress(NotFound):
            await self.kill()
