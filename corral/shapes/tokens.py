"""API tokens as the admin API describes them: stored ones (never their secret) and a new one."""

from __future__ import annotations

from datetime import datetime

from corral.shapes import Wire


class TokenInfo(Wire):
    """A stored token, without its secret."""

    id: str
    role: str
    tenant: str | None = None
    host_id: str | None = None
    source: str | None = None
    created_at: datetime | None = None


class TokenList(Wire):
    tokens: list[TokenInfo]


class IssuedToken(Wire):
    """A new token: ``token`` is its secret, shown once."""

    id: str
    role: str
    tenant: str | None = None
    token: str
