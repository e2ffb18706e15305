"""Proof, for the type checker, that the SQL stores and the in-memory model both give the control
plane what its narrow protocols ask (:mod:`corral.control.ports`, each a face of the store's contract
or a combination of them), and the whole of an aggregate where the model holds one: an assignment
below fails ``mypy`` the moment a signature drifts on either side. Nothing here runs."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from corral.control.ports import (
        ClaimRecords,
        HeartbeatSink,
        HostReader,
        Placements,
        PoolStore,
        RatesPort,
        ReconcilePort,
        SealedSpecs,
        Tenants,
        WaitingQueue,
    )
    from corral.store.contract import FailoverStore, TenantRemoval
    from corral.store.postgres import PostgresStore
    from corral.store.sqlite import SqliteStore
    from corral.testing.store import ModelStore

    def _conforms(model: ModelStore, sqlite: SqliteStore, postgres: PostgresStore) -> None:
        flows: list[ReconcilePort] = [model, sqlite, postgres]
        hosts: list[HostReader] = [model, sqlite, postgres]
        tenants: list[Tenants] = [model, sqlite, postgres]
        pools: list[PoolStore] = [model, sqlite, postgres]
        claims: list[ClaimRecords] = [model, sqlite, postgres]
        waiting: list[WaitingQueue] = [model, sqlite, postgres]
        heartbeats: list[HeartbeatSink] = [model, sqlite, postgres]
        sealed: list[SealedSpecs] = [model, sqlite, postgres]
        placements: list[Placements] = [model, sqlite, postgres]
        failover: list[FailoverStore] = [model, sqlite, postgres]
        rates: list[RatesPort] = [model, sqlite, postgres]
        removals: list[TenantRemoval] = [model, sqlite, postgres]
        del rates, flows, hosts, tenants, pools, claims, waiting, heartbeats, sealed, placements, failover
        del removals
