"""The read side of a sandbox handle: its last known record. The verbs that act on it live with each
client (``AsyncSandbox`` in ``async_client.py``, ``Sandbox`` generated from it in ``client.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corral.client.models import SandboxRecord
from corral.client.retry import CreateStats


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
