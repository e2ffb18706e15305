"""The state of record in memory, with the SQL stores' semantics for what the control plane's flows
call (:mod:`corral.control.ports`): reservations against a host's admittable and CPU (the core's fit
rule, spread score and tie-break), ended exactly once, expired by TTL and with their owner's lease;
sandbox records with quota counters, name uniqueness and idempotency keys; heartbeats whose listings
carry changes on a base with a digest (applied exactly as :mod:`corral.store.listings` applies them),
fences and failover; parked creates, OOM kills, sealed specs and warm pools' intent.

Every method is one "transaction": it may await (a latency, an outage) only before it reads anything,
then runs to completion without yielding, as a serialisable transaction would. ``outage`` makes every
call raise :class:`StoreUnavailable` while it returns true, as a database that cannot be reached.
A property test holds this model to the SQLite store on random sequences of operations.

One module per aggregate, as :mod:`corral.store.sql` is; :class:`ModelStore` is their union.
"""

from __future__ import annotations

import json

from corral.store import rows
from corral.store.records import LIVE_STATES, MAX_PAGE, Usage
from corral.testing.store.access import AccessModel
from corral.testing.store.base import DEFAULT_TEMPLATE
from corral.testing.store.failover import FailoverModel
from corral.testing.store.hosts import HostsModel
from corral.testing.store.leases import LeasesModel
from corral.testing.store.reservations import ReservationsModel
from corral.testing.store.sandboxes import SandboxesModel
from corral.testing.store.templates import TemplatesModel


class ModelStore(
    HostsModel, ReservationsModel, LeasesModel, SandboxesModel, FailoverModel, AccessModel, TemplatesModel
):
    """Every aggregate over one state; what a checker reads (no transaction, no fault) is here."""

    def counted_usage(self, tenant_id: str) -> Usage:
        t = self.tenants[tenant_id]
        return t.usage()

    def recorded_usage(self, tenant_id: str) -> Usage:
        live = [sb for sb in self.sandboxes.values() if sb.tenant_id == tenant_id and sb.state in LIVE_STATES]
        cpu_m = sum(rows.to_millicores(sb.cpus) for sb in live)
        return Usage(len(live), sum(sb.memory_mb for sb in live), rows.from_millicores(cpu_m))

    def dump(self) -> str:
        """The whole state, canonically, for a run's digest."""
        return json.dumps(
            {
                "hosts": {
                    h: [x.seq, x.reserved_mb, x.facts.memory_mb_admittable, x.state]
                    for h, x in self.hosts.items()
                },
                "res": sorted(
                    [r.id, r.host_id, r.memory_mb, r.owner, r.expires_at] for r in self.reservations.values()
                ),
                "sb": sorted(
                    [sb.id, sb.state.value, sb.host_id, sb.version, sb.epoch]
                    for sb in self.sandboxes.values()
                ),
            },
            sort_keys=True,
            default=str,
        )


__all__ = ["DEFAULT_TEMPLATE", "MAX_PAGE", "ModelStore"]
