"""The four kinds over corral's own records and operations: read (one, all, what a change names)
and written (create, patch, delete, scale), each a call the REST API makes too."""

from __future__ import annotations

import builtins
import re
from collections.abc import AsyncIterator, Callable, Iterable
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from corral.api.kube import render
from corral.api.kube.access import Access, Namespaces
from corral.api.kube.kinds import CLAIM, CLAIM_POOL, POOL, SANDBOX, TEMPLATE, Kind
from corral.api.kube.shared import Memo, SharedReads
from corral.api.pools import MAX_POOL_SIZE
from corral.api.schemas import MAX_TTL_S, NAME_PATTERN, SandboxSpecBody, TemplateBody
from corral.control.errors import Conflict, InvalidRequest, ResourceNotFound
from corral.control.plane import ControlPlane
from corral.store import UNSET, ChangeRecord, SandboxRecord, SandboxState, SandboxSummary, TemplateRecord

Obj = dict[str, Any]
# An object and its Table row's cells, rendered together from one read.
Shown = tuple[Obj, list[Any]]
_PAGE = 1000


def _invalid(exc: ValidationError, prefix: str) -> InvalidRequest:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return InvalidRequest(f"{prefix}.{where}" if where else prefix, f"{prefix}.{where}: {first['msg']}")


def as_object(value: Any, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(where, f"{where}: must be an object")
    return value


def _int(value: Any, where: str, lo: int, hi: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise InvalidRequest(where, f"{where}: must be an integer from {lo} to {hi}")
    return value


def _str_map(value: Any, where: str) -> dict[str, str]:
    m = as_object(value, where)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in m.items()):
        raise InvalidRequest(where, f"{where}: keys and values must be strings")
    return m


class Objects:
    def __init__(self, plane: ControlPlane, namespaces: Namespaces) -> None:
        self.plane = plane
        self.ns = namespaces
        # What watches read of a change, and what they show of it: once on this replica, however
        # many watches are open.
        self.shared = SharedReads()
        self.rendered: Memo[tuple[str, int, str], Shown] = Memo()

    # -- reads -----------------------------------------------------------------------------------

    async def record(self, a: Access, name: str) -> SandboxRecord | None:
        if a.tenant is None:
            return None
        store = self.plane.store
        rec = await store.get_sandbox_by_name(a.tenant.id, name)
        if rec is None:
            rec = await store.get_sandbox(name, tenant_id=a.tenant.id)
            if rec is not None and rec.name is not None:
                rec = None  # a named sandbox is known by its name only
        if rec is None or rec.state is SandboxState.DELETED:
            return None
        return rec

    async def get(self, kind: Kind, a: Access, name: str, version: int) -> Obj | None:
        got = await self.shown(kind, a, name, version)
        return got[0] if got is not None else None

    async def shown(self, kind: Kind, a: Access, name: str, version: int) -> Shown | None:
        ns = a.namespace or a.own
        if kind is SANDBOX or kind is CLAIM:
            rec = await self.record(a, name)
            if rec is None or (kind is CLAIM and not render.is_claim(rec)):
                return None
            return self.show_sandbox(kind, rec, ns, version)
        if kind is TEMPLATE:
            t = await self.plane.store.get_template(name)
            return self._shared_shown(kind, render.template(t, ns, version)) if t is not None else None
        for s in await self.plane.pools.list():
            if s.pool.template == name:
                return self._shared_shown(kind, render.pool(s, ns, version))
        return None

    def show_sandbox(self, kind: Kind, rec: SandboxRecord, ns: str, version: int) -> Shown:
        obj = render.sandbox(rec, ns, version) if kind is SANDBOX else render.claim(rec, ns, version)
        return obj, render.sandbox_cells(kind, rec, self.plane.clock.now())

    def _shared_shown(self, kind: Kind, obj: Obj) -> Shown:
        return obj, render.cells(kind, obj, self.plane.clock.now())

    async def need(self, kind: Kind, a: Access, name: str, version: int) -> Obj:
        obj = await self.get(kind, a, name, version)
        if obj is None:
            raise ResourceNotFound(f'{kind.plural}.{kind.group} "{name}" not found')
        return obj

    async def list(self, kind: Kind, a: Access, version: int) -> list[Shown]:
        if kind.shared:
            ns = a.namespace or a.own
            if a.namespace is not None and a.tenant is None:
                return []
            if kind is TEMPLATE:
                objs = [render.template(t, ns, version) for t in await self.plane.store.list_templates()]
            else:
                objs = [render.pool(s, ns, version) for s in await self.plane.pools.list()]
            return [self._shared_shown(kind, o) for o in objs]
        out = []
        async for rec in self.records(a):
            if kind is CLAIM and not render.is_claim(rec):
                continue
            out.append(await self.sandbox_shown(kind, rec, version))
        return out

    async def sandbox_shown(self, kind: Kind, rec: SandboxRecord, version: int) -> Shown:
        return self.show_sandbox(kind, rec, await self.ns.name_of(rec.tenant_id), version)

    async def summaries(
        self, a: Access, after: tuple[float, str] | None, limit: int
    ) -> builtins.list[SandboxSummary]:
        """The summaries of the live sandboxes ``a`` sees (as :meth:`records`), after ``after``."""
        if a.namespace is not None and a.tenant is None:
            return []
        tenant_id = a.tenant.id if a.tenant is not None else None
        return await self.plane.store.list_sandbox_summaries(tenant_id=tenant_id, after=after, limit=limit)

    async def records(self, a: Access) -> AsyncIterator[SandboxRecord]:
        """The live sandbox records ``a`` sees: its namespace's, or (the admin, no namespace) all."""
        if a.namespace is not None and a.tenant is None:
            return
        async for rec in self._records(a.tenant.id if a.tenant is not None else None):
            yield rec

    async def _records(self, tenant_id: str | None) -> AsyncIterator[SandboxRecord]:
        cursor = None
        while True:
            page = await self.plane.store.list_sandboxes(tenant_id=tenant_id, limit=_PAGE, cursor=cursor)
            for rec in page.items:
                if rec.state is not SandboxState.DELETED:
                    yield rec
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def changed(
        self, kind: Kind, a: Access, changes: Iterable[ChangeRecord]
    ) -> builtins.list[tuple[ChangeRecord, Shown | None]]:
        """What each change of ``kind`` visible to ``a`` is now: its object, or None (it is gone).
        Rendered once per change and namespace on this replica: every watch shares it."""
        want = {SANDBOX: "sandbox", CLAIM: "sandbox", TEMPLATE: "template", POOL: "pool"}[kind]
        mine = [c for c in changes if c.kind == want]
        if not kind.shared and a.tenant is not None:
            mine = [c for c in mine if c.tenant_id == a.tenant.id]
        elif not kind.shared and a.namespace is not None:
            mine = []
        if not mine:
            return []
        out: builtins.list[tuple[ChangeRecord, Shown | None]] = []
        ns = a.namespace or a.own
        if want == "sandbox":
            records: dict[str, SandboxRecord] = {}
            for read in await self.shared.read("sandbox", mine, self._sandboxes_of):
                records.update(read)
            for c in mine:
                rec = records.get(c.key)
                if rec is None or c.deleted or rec.state is SandboxState.DELETED:
                    out.append((c, None))
                elif kind is SANDBOX or render.is_claim(rec):
                    own = await self.ns.name_of(rec.tenant_id)
                    key = (kind.plural, c.version, own)
                    shown = self.rendered.get(key) or self.rendered.put(
                        key, self.show_sandbox(kind, rec, own, c.version)
                    )
                    out.append((c, shown))
            return out
        found: dict[str, Any] = {}  # a template's record, or a pool's status, by name
        draw: Callable[[Any, str, int], Obj]
        if want == "template":
            for templates in await self.shared.read("template", mine, self._templates_of):
                found.update(templates)
            draw = render.template
        else:
            for listed in await self.shared.read("pool", mine, lambda _: self.plane.pools.list()):
                found.update({s.pool.template: s for s in listed})
            draw = render.pool
        for c in mine:
            record = None if c.deleted else found.get(c.key)
            if record is None:
                out.append((c, None))
                continue
            key = (kind.plural, c.version, ns)
            shown = self.rendered.get(key) or self.rendered.put(
                key, self._shared_shown(kind, draw(record, ns, c.version))
            )
            out.append((c, shown))
        return out

    async def _sandboxes_of(self, changes: builtins.list[ChangeRecord]) -> dict[str, SandboxRecord]:
        return await self.plane.store.get_sandboxes({c.key for c in changes if not c.deleted})

    async def _templates_of(self, changes: builtins.list[ChangeRecord]) -> dict[str, TemplateRecord | None]:
        return {c.key: await self.plane.store.get_template(c.key) for c in changes if not c.deleted}

    async def gone(self, kind: Kind, c: ChangeRecord, a: Access) -> Obj:
        """The last word on an object that is gone: its kind, name and namespace."""
        ns = await self.ns.name_of(c.tenant_id) if c.tenant_id else (a.namespace or a.own)
        uid = {SANDBOX: c.key, CLAIM: f"claim-{c.key}"}.get(kind, f"{kind.singular}-{c.key}")
        meta = {"name": c.name or c.key, "namespace": ns, "uid": uid, "resourceVersion": str(c.version)}
        return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}

    # -- writes ----------------------------------------------------------------------------------

    async def create(self, kind: Kind, a: Access, body: Obj) -> Obj:
        meta = as_object(body.get("metadata"), "metadata")
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest("metadata.name", "metadata.name: required")
        spec = as_object(body.get("spec"), "spec")
        labels = _str_map(meta.get("labels"), "metadata.labels")
        if kind is SANDBOX or kind is CLAIM:
            tenant = a.tenant_or_404()
            if kind is CLAIM:
                create = await self._claim_spec(name, spec, labels)
            else:
                create = self._sandbox_spec(name, spec, labels)
            try:
                rec, _ = await self.plane.creates.create(tenant.id, create.create_spec())
            except Conflict as exc:  # the store keeps names unique among the live: no read first
                if exc.details.get("field") == "name":
                    raise conflict(kind, name) from exc
                raise
            await self.plane.sandboxes.remember(rec)
            return (await self.sandbox_shown(kind, rec, (await self.plane.store.change_bounds())[1]))[0]
        a.need_admin(kind.plural)
        version = (await self.plane.store.change_bounds())[1]
        if kind is TEMPLATE:
            try:
                tb = TemplateBody.model_validate({"name": name, **_template_fields(spec)})
            except ValidationError as exc:
                raise _invalid(exc, "spec") from None
            await self.plane.create_template(tb.record())
        else:
            ref = as_object(spec.get("sandboxTemplateRef"), "spec.sandboxTemplateRef").get("name", name)
            if ref != name:
                raise InvalidRequest(
                    "spec.sandboxTemplateRef.name",
                    "a warm pool is named after its template: one pool per template",
                )
            _known(spec, {"replicas", "sandboxTemplateRef", "maxPerHost"}, "spec")
            size = _int(spec.get("replicas", 0), "spec.replicas", 0, MAX_POOL_SIZE)
            cap = spec.get("maxPerHost")
            if cap is not None:
                cap = _int(cap, "spec.maxPerHost", 1, MAX_POOL_SIZE)
            await self.plane.pools.create(name, size, cap)
        return await self.need(kind, a, name, version + 1)

    def _sandbox_spec(self, name: str, spec: Obj, labels: dict[str, str]) -> SandboxSpecBody:
        _known(
            spec,
            {
                "sandboxTemplateRef",
                "memoryMB",
                "cpus",
                "stateful",
                "ttlSeconds",
                "env",
                "failover",
                "waitSeconds",
                "diskMB",
            },
            "spec",
        )
        fields = {
            "template": as_object(spec.get("sandboxTemplateRef"), "spec.sandboxTemplateRef").get(
                "name", "default"
            ),
            "memory_mb": spec.get("memoryMB"),
            "cpus": spec.get("cpus"),
            "stateful": spec.get("stateful"),
            "ttl_seconds": spec.get("ttlSeconds"),
            "env": spec.get("env") or {},
            "failover": spec.get("failover"),
            "wait_s": spec.get("waitSeconds"),
            "disk_mb": spec.get("diskMB"),
        }
        return self._body(name, fields, labels)

    async def _claim_spec(self, name: str, spec: Obj, labels: dict[str, str]) -> SandboxSpecBody:
        _known(spec, {"warmPoolRef", "env", "ttlSeconds", "lifecycle"}, "spec")
        pool = as_object(spec.get("warmPoolRef"), "spec.warmPoolRef").get("name")
        if not isinstance(pool, str) or not pool:
            raise InvalidRequest("spec.warmPoolRef.name", "spec.warmPoolRef.name: required")
        if await self.plane.pool_book.get(pool) is None:
            raise InvalidRequest("spec.warmPoolRef.name", f'WarmPoolNotFound: no warm pool "{pool}"')
        fields = {"template": pool, "ttl_seconds": spec.get("ttlSeconds"), "env": spec.get("env") or {}}
        return self._body(name, fields, {**labels, CLAIM_POOL: pool})

    @staticmethod
    def _body(name: str, fields: dict[str, Any], labels: dict[str, str]) -> SandboxSpecBody:
        if not re.match(NAME_PATTERN, name):
            raise InvalidRequest("metadata.name", "metadata.name: a DNS label (a-z, 0-9, '-'), at most 63")
        try:
            return SandboxSpecBody.model_validate(
                {**{k: v for k, v in fields.items() if v is not None}, "name": name, "metadata": labels}
            )
        except ValidationError as exc:
            raise _invalid(exc, "spec") from None

    async def delete(self, kind: Kind, a: Access, name: str) -> None:
        if kind is SANDBOX or kind is CLAIM:
            rec = await self.record(a, name)
            if rec is None or (kind is CLAIM and not render.is_claim(rec)):
                raise ResourceNotFound(f'{kind.plural}.{kind.group} "{name}" not found')
            await self.plane.sandboxes.delete(rec.id, rec.tenant_id)
            return
        a.need_admin(kind.plural)
        if kind is POOL:
            await self.plane.pools.delete(name)
        elif not await self.plane.store.delete_template(name):
            raise ResourceNotFound(f'{kind.plural}.{kind.group} "{name}" not found')

    async def update(self, kind: Kind, a: Access, name: str, new: Obj, version: int) -> Obj:
        """``new`` is the whole object as the caller wants it: what corral can change is changed,
        anything else that differs is refused (422: immutable)."""
        old = await self.need(kind, a, name, version)
        new_spec = as_object(new.get("spec"), "spec")
        changed = {k for k in set(old["spec"]) | set(new_spec) if old["spec"].get(k) != new_spec.get(k)}
        mutable = {POOL: {"replicas", "maxPerHost"}, SANDBOX: {"shutdownTime"}}.get(kind, set())
        if changed - mutable:
            field = sorted(changed - mutable)[0]
            raise InvalidRequest(f"spec.{field}", f"spec.{field}: field is immutable")
        if not changed:
            return old
        if kind is POOL:
            a.need_admin(kind.plural)
            size = _int(new_spec.get("replicas", 0), "spec.replicas", 0, MAX_POOL_SIZE)
            cap: Any = UNSET
            if "maxPerHost" in changed:
                cap = new_spec.get("maxPerHost")
                if cap is not None:
                    cap = _int(cap, "spec.maxPerHost", 1, MAX_POOL_SIZE)
            await self.plane.pools.update(name, size, cap)
        else:
            rec = await self.record(a, name)
            assert rec is not None
            at = new_spec.get("shutdownTime")
            await self.plane.store.set_sandbox_expiry(rec.id, _expiry(at, self.plane.clock.now()))
        return await self.need(kind, a, name, (await self.plane.store.change_bounds())[1])

    async def scale(self, a: Access, name: str, replicas: Any, version: int) -> Obj:
        obj = await self.need(POOL, a, name, version)
        return await self.update(
            POOL, a, name, {**obj, "spec": {**obj["spec"], "replicas": replicas}}, version
        )


def _known(spec: Obj, allowed: set[str], where: str) -> None:
    unknown = sorted(set(spec) - allowed)
    if unknown:
        raise InvalidRequest(f"{where}.{unknown[0]}", f'{where}: unknown field "{unknown[0]}"')


def _template_fields(spec: Obj) -> dict[str, Any]:
    _known(spec, {"cpus", "memoryMB", "stateful", "description", "pids", "failover", "diskMB"}, "spec")
    names = {"memoryMB": "memory_mb", "diskMB": "disk_mb"}
    return {names.get(k, k): v for k, v in spec.items()}


def _expiry(value: Any, now: float) -> float | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest("spec.shutdownTime", "spec.shutdownTime: an RFC 3339 time")
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise InvalidRequest("spec.shutdownTime", "spec.shutdownTime: an RFC 3339 time") from None
    if not now < at <= now + MAX_TTL_S:
        raise InvalidRequest("spec.shutdownTime", "spec.shutdownTime: in the future, within 30 days")
    return at


def conflict(kind: Kind, name: str) -> Conflict:
    return Conflict(f'{kind.plural}.{kind.group} "{name}" already exists')
