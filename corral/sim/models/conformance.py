"""Proof, for the type checker, that the SQL stores and the in-memory model both give the control
plane's flows what their narrow protocols ask (:mod:`corral.control.ports`), and what warm pools and
the heartbeat intake call besides (:class:`_PoolsAndOoms`): an assignment below fails ``mypy`` the
moment a signature drifts on either side. Nothing here runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Protocol

    from corral.control.ports import HostReader, ReconcilePort, Tenants
    from corral.sim.models.store import ModelStore
    from corral.store import CreateOutcome, PoolRecord, SandboxRecord, TemplateRecord
    from corral.store.postgres import PostgresStore
    from corral.store.records import _Unset
    from corral.store.sqlite import SqliteStore

    class _PoolsAndOoms(Protocol):
        async def check_create(
            self,
            record: SandboxRecord,
            *,
            idempotency_key: str | None = None,
            request_hash: str | None = None,
        ) -> CreateOutcome | None: ...

        async def record_oom_kills(self, host_id: str, counts: Mapping[str, int]) -> None: ...

        async def list_templates(self) -> list[TemplateRecord]: ...

        async def create_pool(
            self, template: str, *, size: int, max_per_host: int | None = None
        ) -> PoolRecord: ...

        async def update_pool(
            self, template: str, *, size: int | None = None, max_per_host: int | _Unset | None = ...
        ) -> PoolRecord: ...

        async def delete_pool(self, template: str) -> bool: ...

        async def list_pools(self) -> list[PoolRecord]: ...

        async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool: ...

    def _conforms(model: ModelStore, sqlite: SqliteStore, postgres: PostgresStore) -> None:
        flows: list[ReconcilePort] = [model, sqlite, postgres]
        hosts: list[HostReader] = [model, sqlite, postgres]
        tenants: list[Tenants] = [model, sqlite, postgres]
        warm: list[_PoolsAndOoms] = [model, sqlite, postgres]
        del flows, hosts, tenants, warm
