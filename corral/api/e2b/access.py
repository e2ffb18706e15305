"""A sandbox's data-plane access token: an HMAC of its id under a secret every replica holds, so any
replica can check a token without a store read or a stored secret per sandbox."""

from __future__ import annotations

import hashlib
import hmac

from corral.api.fleetkey import FleetKey
from corral.store import Store


class AccessKey(FleetKey):
    """The key that signs access tokens."""

    NAME = "e2b-access"

    def __init__(self, store: Store) -> None:
        super().__init__(store, self.NAME)


def access_token(secret: bytes, sandbox_id: str) -> str:
    return hmac.new(secret, sandbox_id.encode(), hashlib.sha256).hexdigest()


def valid(secret: bytes, sandbox_id: str, presented: str) -> bool:
    return hmac.compare_digest(access_token(secret, sandbox_id).encode(), presented.encode())


def traffic_token(secret: bytes, sandbox_id: str) -> str:
    """What a request to a token-guarded sandbox's port carries (``e2b-traffic-access-token``): a
    key of its own under the same secret, so it opens the ports and nothing of the data plane."""
    return hmac.new(secret, b"traffic\0" + sandbox_id.encode(), hashlib.sha256).hexdigest()


def traffic_valid(secret: bytes, sandbox_id: str, presented: str) -> bool:
    return hmac.compare_digest(traffic_token(secret, sandbox_id).encode(), presented.encode("latin-1"))
