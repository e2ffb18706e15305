"""Where each sandbox runs, remembered by this replica so that running sandboxes keep serving (exec,
delete) while the store is unreachable: placement writes are CP, routing is cached."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    tenant_id: str
    host_id: str
    address: str
    epoch: int = 0


class LocationCache:
    def __init__(self, capacity: int = 100_000) -> None:
        self._capacity = capacity
        self._locations: OrderedDict[str, Location] = OrderedDict()

    def put(self, sandbox_id: str, loc: Location) -> None:
        self._locations[sandbox_id] = loc
        self._locations.move_to_end(sandbox_id)
        while len(self._locations) > self._capacity:
            self._locations.popitem(last=False)

    def get(self, sandbox_id: str) -> Location | None:
        return self._locations.get(sandbox_id)

    def drop(self, sandbox_id: str) -> None:
        self._locations.pop(sandbox_id, None)
