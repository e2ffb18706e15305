"""Templates and warm pools' intent in the store model."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from corral.store.contract import TemplateStore
from corral.store.errors import (
    InvalidRecord,
    NameConflict,
    RecordNotFound,
)
from corral.store.records import (
    PoolRecord,
    TemplateRecord,
    _Unset,
)
from corral.testing.store.base import ModelBase


class TemplatesModel(ModelBase, TemplateStore):
    async def _create_template_checked(self, template: TemplateRecord) -> TemplateRecord:
        await self._enter()
        if template.name in self.templates:
            raise NameConflict(f"template {template.name!r} exists")
        self.templates[template.name] = rec = replace(template, created_at=self._now())
        return rec

    async def _publish_template_checked(self, template: TemplateRecord) -> TemplateRecord:
        await self._enter()
        current = self.templates.get(template.name)
        if current is None or current.version != template.version - 1:
            raise NameConflict(f"template {template.name!r} is not at version {template.version - 1}")
        self.templates[template.name] = rec = replace(template, created_at=self._now())
        return rec

    async def delete_template(self, name: str) -> bool:
        await self._enter()
        return self.templates.pop(name, None) is not None

    async def get_template(self, name: str) -> TemplateRecord | None:
        await self._enter()
        return self.templates.get(name)

    async def images_in_use(self) -> set[str]:
        await self._enter()
        named = [t.image for t in self.templates.values()] + [s.image for s in self.sandboxes.values()]
        return {image for image in named if image is not None}

    async def list_templates(self) -> list[TemplateRecord]:
        await self._enter()
        return [self.templates[n] for n in sorted(self.templates)]

    async def _create_pool_checked(self, template: str, size: int, max_per_host: int | None) -> PoolRecord:
        await self._enter()
        if template not in self.templates:
            raise RecordNotFound(f"template {template!r}")
        if template in self.pools:
            raise NameConflict(f"template {template!r} already has a pool")
        now = self._now()
        self.pools[template] = rec = PoolRecord(template, size, max_per_host, {}, now, now)
        return rec

    async def _update_pool_checked(
        self, template: str, size: int | None, max_per_host: int | _Unset | None
    ) -> PoolRecord:
        await self._enter()
        pool = self.pools.get(template)
        if pool is None:
            raise RecordNotFound(f"no pool for template {template!r}")
        pool = replace(pool, updated_at=self._now())
        if size is not None:
            pool = replace(pool, size=size)
        if not isinstance(max_per_host, _Unset):
            pool = replace(pool, max_per_host=max_per_host)
        self.pools[template] = pool
        return pool

    async def delete_pool(self, template: str) -> bool:
        await self._enter()
        return self.pools.pop(template, None) is not None

    async def list_pools(self) -> list[PoolRecord]:
        await self._enter()
        return [self.pools[t] for t in sorted(self.pools)]

    async def set_pool_targets(self, template: str, targets: Mapping[str, int]) -> bool:
        if any(n < 0 for n in targets.values()):
            raise InvalidRecord("targets: must not be negative")
        await self._enter()
        pool = self.pools.get(template)
        if pool is None:
            return False
        kept = {h: n for h, n in sorted(targets.items()) if n > 0}
        self.pools[template] = replace(pool, targets=kept)
        return True
