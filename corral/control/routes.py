"""Where each sandbox runs, remembered by this replica so that running sandboxes keep serving (exec,
delete) while the store is unreachable: placement writes are CP, routing is cached."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    tenant_id: str
    host_id: str
    address: str
    epoch: int = 0


class RouteCache:
    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._routes: OrderedDict[str, Route] = OrderedDict()

    def put(self, sandbox_id: str, route: Route) -> None:
        self._routes[sandbox_id] = route
        self._routes.move_to_end(sandbox_id)
        while len(self._routes) > self._capacity:
            self._routes.popitem(last=False)

    def get(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    def drop(self, sandbox_id: str) -> None:
        self._routes.pop(sandbox_id, None)
