"""The control plane's replicas as a host's agent calls them, with its own token: it sticks to the
replica that last answered and tries the others in turn after it, so one dead replica never cuts a
live host off (its heartbeats, the images it fetches)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import httpx


class Replicas:
    """What an agent's HTTP client of the control plane holds: the replicas' base URLs, which one
    answered last, and one client that presents the token."""

    TIMEOUT_S: ClassVar[float] = 5.0  # a caller's own default where it waits longer

    def __init__(
        self,
        control_plane: str | Sequence[str],
        token: str,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float | None = None,
    ) -> None:
        bases = [control_plane] if isinstance(control_plane, str) else list(control_plane)
        if not bases:
            raise ValueError("at least one control-plane URL is needed")
        self.bases = [b.rstrip("/") for b in bases]
        self._current = 0
        self._client = httpx.AsyncClient(
            transport=transport,
            timeout=self.TIMEOUT_S if timeout_s is None else timeout_s,
            headers={"Authorization": f"Bearer {token}"},
        )

    def _in_turn(self) -> list[int]:
        """The replicas' indexes, the one that answered last first."""
        start, n = self._current, len(self.bases)
        return [(start + step) % n for step in range(n)]

    async def aclose(self) -> None:
        await self._client.aclose()
