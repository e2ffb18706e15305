"""The read side of a sandbox handle: its last known record. The verbs that act on it live with each
client (``AsyncSandbox`` in ``async_client.py``, ``Sandbox`` generated from it in ``client.py``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corral.client.fields import Shown
from corral.client.models import SandboxRecord
from corral.client.retry import CreateStats


class SandboxView:
    """Read-only fields of the last record the server sent. ``refresh()`` fetches a newer one."""

    __slots__ = ("_record", "create_stats")

    def __init__(self, record: SandboxRecord, create_stats: CreateStats | None = None) -> None:
        self._record = record
        # Set only on the handle a create returned: what it took to get a placement.
        self.create_stats = create_stats

    id = Shown[str]("_record")
    name = Shown[str | None]("_record")
    tenant = Shown[str | None]("_record")
    template = Shown[str]("_record")
    host_id = Shown[str | None]("_record")
    state = Shown[str]("_record")
    memory_mb = Shown[int | None]("_record")
    cpus = Shown[float | None]("_record")
    stateful = Shown[bool]("_record")
    # Taken from a warm pool rather than started for this create.
    warm = Shown[bool]("_record")
    created_at = Shown[datetime | None]("_record")
    expires_at = Shown[datetime | None]("_record")

    @property
    def record(self) -> SandboxRecord:
        return self._record

    @property
    def metadata(self) -> dict[str, Any]:
        return dict(self._record.metadata)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(id={self.id!r}, host_id={self.host_id!r}, state={self.state!r})"
