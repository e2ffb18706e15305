"""Templates as a replica reads them on every create and every start: what exists is cached briefly,
since templates change rarely (an absence is never cached: a template just made is found at once)."""

from __future__ import annotations

from corral.control.ports import Specs
from corral.core import Clock
from corral.images.config import ImageConfig
from corral.store import SandboxRecord, TemplateRecord

TEMPLATE_CACHE_S = 5.0


class Templates:
    def __init__(self, store: Specs, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._cached: dict[str, tuple[TemplateRecord, float]] = {}

    async def get(self, name: str) -> TemplateRecord | None:
        now = self._clock.now()
        hit = self._cached.get(name)
        if hit is not None and hit[1] > now:
            return hit[0]
        tpl = await self._store.get_template(name)
        if tpl is not None:
            self._cached[name] = (tpl, now + TEMPLATE_CACHE_S)
        return tpl

    def forget(self, name: str) -> None:
        """Read ``name`` from the store next time (this replica just replaced it)."""
        self._cached.pop(name, None)

    async def pids(self, name: str) -> int | None:
        """The pids limit a sandbox of ``name`` runs with (None: the runtime's default)."""
        tpl = await self.get(name)
        return tpl.pids if tpl is not None else None

    async def image_config(self, record: SandboxRecord) -> ImageConfig | None:
        """How ``record``'s image says its sandbox runs: its template's config while the template
        still names that image (a rebuild since: the defaults, as the image's own files set them)."""
        if record.image is None:
            return None
        tpl = await self.get(record.template)
        return tpl.image_config if tpl is not None and tpl.image == record.image else None
