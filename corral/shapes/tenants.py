"""Tenants as the admin API describes them, and the E2B-form keys issued to them."""

from __future__ import annotations

from corral.shapes import Wire


class Tenant(Wire):
    """A tenant and its limits; ``token`` is its first token's secret, only in the answer that made it."""

    id: str
    name: str
    max_sandboxes: int
    max_memory_mb: int
    max_cpus: float
    # Its create rate (creates a second, and at once); None: the control plane's configured default.
    create_rate_per_s: float | None = None
    create_burst: int | None = None
    token: str | None = None


class TenantList(Wire):
    tenants: list[Tenant]


class E2bKey(Wire):
    """A tenant token spelt ``e2b_`` and hex, for the e2b SDK versions that insist on that form."""

    tenant_id: str
    tenant: str | None = None  # its name; an older server sends only the id
    key: str
