"""A sandbox's data-plane access token: an HMAC of its id under a secret every replica holds, so any
replica can check a token without a store read or a stored secret per sandbox."""

from __future__ import annotations

import hashlib
import hmac
import secrets


def derive_secret(*material: str | None) -> bytes:
    """The replicas' shared key, from what every replica of one deployment is started with; a key of
    its own for a server started with nothing to derive one from (never a constant anyone could use)."""
    if not any(material):
        return secrets.token_bytes(32)
    return hashlib.sha256(b"corral-e2b-access\0" + "\0".join(m or "" for m in material).encode()).digest()


def access_token(secret: bytes, sandbox_id: str) -> str:
    return hmac.new(secret, sandbox_id.encode(), hashlib.sha256).hexdigest()


def valid(secret: bytes, sandbox_id: str, presented: str) -> bool:
    return hmac.compare_digest(access_token(secret, sandbox_id).encode(), presented.encode())
