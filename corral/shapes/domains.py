"""Custom domains as the API describes them: ``hostname`` reaches ``port`` of ``sandbox_id`` through
any replica, as ``{port}-{sandbox_id}.{domain}`` does."""

from __future__ import annotations

from corral.shapes import Wire


class Domain(Wire):
    hostname: str
    sandbox_id: str
    port: int


class DomainList(Wire):
    domains: list[Domain]
