"""What both SQL backends share: every operation of the contract written once against a small
transaction seam (:class:`Tx`), in the SQL subset SQLite and PostgreSQL both speak.

A backend supplies ``_write`` (run a function in one write transaction: ``BEGIN IMMEDIATE`` on
SQLite, a pooled connection's transaction on PostgreSQL), ``_read``, a row-lock clause and its driver's
error mapping, and may override a hot path with a faster single statement.

Reservation bookkeeping. ``hosts.reserved_mb`` / ``reserved_cpu_m`` count every reservation row of the
host, and every change to a row changes the counter in the same transaction, so capacity can be
checked with one conditional UPDATE of one row (which PostgreSQL re-checks against the newest row
version under concurrency: the double-booking guard). Rows that expired but were not swept are still
in the counter; readers subtract them, and a reservation that finds no room first ends the expired
ones of that host and tries again, so an expired reservation never costs a refusal.

Lock order, to keep PostgreSQL free of deadlocks: host rows first (several at once: sorted by id),
then reservation rows.

One module per aggregate; :class:`SqlStore` is their union."""

from __future__ import annotations

from corral.store.records import MAX_PAGE
from corral.store.sql.access import AccessSql
from corral.store.sql.base import (
    Params,
    SqlBase,
    Tx,
    token_hash,
)
from corral.store.sql.changes import ChangesSql
from corral.store.sql.domains import DomainsSql
from corral.store.sql.failover import FailoverSql
from corral.store.sql.hosts import HostsSql
from corral.store.sql.leases import LeasesSql
from corral.store.sql.reservations import ReservationsSql
from corral.store.sql.sandboxes import SandboxesSql
from corral.store.sql.templates import TemplatesSql


class SqlStore(
    HostsSql,
    ReservationsSql,
    LeasesSql,
    SandboxesSql,
    FailoverSql,
    AccessSql,
    TemplatesSql,
    ChangesSql,
    DomainsSql,
):
    """Every aggregate over one transaction seam; a backend subclasses this."""


__all__ = [
    "MAX_PAGE",
    "Params",
    "SqlBase",
    "SqlStore",
    "Tx",
    "token_hash",
]
