"""A key every replica holds: one random secret in the store under a name of its own, kept across
restarts and admin-token rotations; read once per replica, then held in memory. What one replica
signs with it (a sandbox's access token, a list's continue token) any other can check."""

from __future__ import annotations

from corral.store import Store


class FleetKey:
    def __init__(self, store: Store, name: str) -> None:
        self._store = store
        self.name = name
        self._key: bytes | None = None

    async def get(self) -> bytes:
        if self._key is None:
            self._key = (await self._store.fleet_secret(self.name)).encode()
        return self._key
