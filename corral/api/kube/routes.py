"""The resource routes: ``/apis/{group}/{version}[/namespaces/{ns}]/{plural}[/{name}[/scale|/status]]``
with get, list, watch, create, patch (merge, strategic as merge, server-side apply), update and
delete, each answered from :class:`Objects`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from corral.api.kube import render, table
from corral.api.kube.access import Access, Namespaces
from corral.api.kube.feed import ChangeHub, Expired
from corral.api.kube.kinds import BY_PLURAL, POOL, SANDBOX, VERSION, Kind
from corral.api.kube.listing import SandboxLists, scope_of
from corral.api.kube.objects import Objects, Shown, as_object, conflict
from corral.api.kube.select import fields, labels
from corral.api.kube.shared import Memo
from corral.api.kube.status import ObjectResponse, status_body, status_response
from corral.codes import ErrorCode
from corral.control.errors import ControlError, InvalidRequest, ResourceNotFound
from corral.jsontext import dump_bytes
from corral.store import ChangeRecord, StoreError

Obj = dict[str, Any]
BOOKMARK_EVERY_S = 5.0
MAX_WATCH_S = 3600.0
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


class UnsupportedMedia(ControlError):
    code = ErrorCode.UNSUPPORTED_MEDIA_TYPE


class Surface:
    """The routes' shared state: the control plane's records through :class:`Objects`, and this
    replica's change hub."""

    def __init__(self, objects: Objects, namespaces: Namespaces, hub: ChangeHub) -> None:
        self.objects = objects
        self.ns = namespaces
        self.hub = hub
        self.lists = SandboxLists(objects)
        # Each change's watch event, encoded once per kind, namespace and format on this replica
        # and shared by every watch that gets it.
        self.encoded: Memo[tuple[Any, ...], bytes] = Memo()

    # -- dispatch --------------------------------------------------------------------------------

    def kind(self, request: Request) -> Kind:
        p = request.path_params
        kind = BY_PLURAL.get((p["group"], p["plural"]))
        if kind is None or p["version"] != VERSION:
            raise ResourceNotFound(f"the server could not find the requested resource ({request.url.path})")
        return kind

    async def collection(self, request: Request) -> Response:
        kind = self.kind(request)
        a = await self.ns.access(request, request.path_params.get("namespace"))
        if request.method == "POST":
            return await self._create(kind, a, request)
        q = request.query_params
        if q.get("watch") in ("1", "true", "True"):
            return await self._watch(kind, a, request)
        return await self._list(kind, a, request)

    async def item(self, request: Request) -> Response:
        kind = self.kind(request)
        a = await self.ns.access(request, request.path_params["namespace"])
        name = request.path_params["name"]
        sub = request.path_params.get("sub")
        if sub not in (None, "status", "scale") or (sub == "scale" and kind is not POOL):
            raise ResourceNotFound(f"no subresource {sub!r} of {kind.plural}")
        version = await self.version()
        if request.method == "GET":
            shown = await self.objects.shown(kind, a, name, version)
            if shown is None:
                raise ResourceNotFound(f'{kind.plural}.{kind.group} "{name}" not found')
            obj, cells = shown
            if sub == "scale":
                return ObjectResponse(_scale(obj))
            if sub is None and table.wants_table(request.headers.get("accept", "")):
                include = request.query_params.get("includeObject", "Metadata")
                return ObjectResponse(
                    table.table(kind, [table.row(cells, obj["metadata"], obj, include)], version)
                )
            return ObjectResponse(obj)
        if request.method == "DELETE":
            await self.objects.delete(kind, a, name)
            return ObjectResponse(
                {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Success",
                    "details": {"name": name, "group": kind.group, "kind": kind.plural},
                }
            )
        if request.method not in ("PATCH", "PUT"):
            return status_response(405, f"{request.method} is not allowed here", ErrorCode.METHOD_NOT_ALLOWED)
        _no_dry_run(request)
        body = await _body(request)
        ctype = request.headers.get("content-type", "").split(";")[0].strip()
        if sub == "scale":
            if request.method == "PATCH":
                body = _merge(_scale(await self.objects.need(kind, a, name, version)), body)
            replicas = as_object(body.get("spec"), "spec").get("replicas")
            return ObjectResponse(_scale(await self.objects.scale(a, name, replicas, version)))
        current = await self.objects.get(kind, a, name, version)
        if current is None:
            if ctype == "application/apply-patch+yaml":  # server-side apply creates what is missing
                obj = await self.objects.create(
                    kind,
                    a,
                    {**body, "metadata": {**as_object(body.get("metadata"), "metadata"), "name": name}},
                )
                return ObjectResponse(obj, status_code=201)
            raise ResourceNotFound(f'{kind.plural}.{kind.group} "{name}" not found')
        if request.method == "PATCH":
            if ctype == "application/json-patch+json":
                raise UnsupportedMedia("JSON patches are not taken here: use --type merge")
            new = (
                _merge(current, body)
                if ctype != "application/apply-patch+yaml"
                else {
                    **current,
                    **body,
                    "spec": {**current.get("spec", {}), **as_object(body.get("spec"), "spec")},
                }
            )
        else:
            new = body
        return ObjectResponse(await self.objects.update(kind, a, name, new, version))

    async def version(self) -> int:
        await self.hub.start()
        return (await self.hub.store.change_bounds())[1]

    # -- list, create ----------------------------------------------------------------------------

    async def _matching(self, kind: Kind, a: Access, request: Request, version: int) -> list[Shown]:
        q = request.query_params
        by_label = labels(q.get("labelSelector"))
        by_field, pinned = fields(q.get("fieldSelector"))
        if pinned is not None and a.namespace is not None:
            one = await self.objects.shown(kind, a, pinned, version)
            got = [one] if one is not None else []
        else:
            got = await self.objects.list(kind, a, version)
        return [s for s in got if by_label(s[0]) and by_field(s[0])]

    async def _list(self, kind: Kind, a: Access, request: Request) -> Response:
        q = request.query_params
        version = await self.version()
        as_table = table.wants_table(request.headers.get("accept", ""))
        include = q.get("includeObject", "Metadata")
        more = None
        pinned = fields(q.get("fieldSelector"))[1] is not None and a.namespace is not None
        if kind.shared or pinned:
            # A few records (templates, pools; one name): answered whole, as a server may whatever
            # the limit. A token is still read, so that a bad one is refused here as anywhere.
            if q.get("continue"):
                await self.lists.tokens.read(q["continue"], scope_of(a), kind.plural)
            shown = await self._matching(kind, a, request, version)
        else:
            by_label = labels(q.get("labelSelector"))
            by_field, _ = fields(q.get("fieldSelector"))
            page = await self.lists.page(
                kind, a, version, q.get("limit"), q.get("continue"), lambda o: by_label(o) and by_field(o)
            )
            version, more = page.version, page.more
            if as_table and include != "Object":
                now = self.objects.plane.clock.now()
                rows = [
                    table.row(render.sandbox_cells(kind, s, now), meta, None, include)
                    for s, meta in page.rows
                ]
                return ObjectResponse(table.table(kind, rows, version, more=more))
            shown = await self.lists.objects_of(kind, page)
        if as_table:
            rows = [table.row(cells, obj["metadata"], obj, include) for obj, cells in shown]
            return ObjectResponse(table.table(kind, rows, version, more=more))
        meta: Obj = {"resourceVersion": str(version)}
        if more is not None:
            meta["continue"] = more
        return ObjectResponse(
            {
                "apiVersion": kind.api_version,
                "kind": f"{kind.kind}List",
                "metadata": meta,
                "items": [obj for obj, _ in shown],
            }
        )

    async def _create(self, kind: Kind, a: Access, request: Request) -> Response:
        _no_dry_run(request)
        body = await _body(request)
        if body.get("kind") not in (None, kind.kind) or body.get("apiVersion") not in (
            None,
            kind.api_version,
        ):
            raise InvalidRequest("kind", f"this collection holds {kind.api_version} {kind.kind}")
        name = as_object(body.get("metadata"), "metadata").get("name")
        # A sandbox's or claim's name is checked by its create, in the store.
        if kind.shared and isinstance(name, str) and await self.objects.get(kind, a, name, 0) is not None:
            raise conflict(kind, name)
        return ObjectResponse(await self.objects.create(kind, a, body), status_code=201)

    # -- watch -----------------------------------------------------------------------------------

    async def _watch(self, kind: Kind, a: Access, request: Request) -> Response:
        q = request.query_params
        await self.hub.start()
        rv_text = q.get("resourceVersion") or ""
        initial = q.get("sendInitialEvents") in ("true", "1")
        if initial and q.get("resourceVersionMatch") != "NotOlderThan":
            raise InvalidRequest(
                "resourceVersionMatch", "sendInitialEvents needs resourceVersionMatch=NotOlderThan"
            )
        try:
            since = int(rv_text) if rv_text else 0
        except ValueError:
            raise InvalidRequest("resourceVersion", "resourceVersion: a version this server gave") from None
        if since < 0:
            raise InvalidRequest("resourceVersion", "resourceVersion: a version this server gave")
        synthetic = since == 0 or initial
        if synthetic:
            since = await self.version()
        else:
            try:
                await self.hub.check(since)
            except Expired as exc:
                return status_response(410, str(exc), ErrorCode.RESOURCE_VERSION_EXPIRED)
        start = await self._matching(kind, a, request, since) if synthetic else []
        by_label = labels(q.get("labelSelector"))
        by_field, _ = fields(q.get("fieldSelector"))
        as_table = table.wants_table(request.headers.get("accept", ""))
        include = q.get("includeObject", "Metadata")
        try:
            timeout = min(float(q.get("timeoutSeconds") or MAX_WATCH_S), MAX_WATCH_S)
        except ValueError:
            raise InvalidRequest("timeoutSeconds", "timeoutSeconds: a number") from None
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        surface = self
        form = ("table", include) if as_table else ("json",)

        async def stream() -> AsyncIterator[bytes]:
            first = True  # a Table watch's first row carries the column definitions
            known: set[str] = set()

            def event(type_: str, obj: Obj, cells: list[Any] | None = None) -> bytes:
                nonlocal first
                if cells is not None and as_table:
                    meta = obj["metadata"]
                    row = table.row(cells, meta, obj, include)
                    obj = table.table(kind, [row], int(meta["resourceVersion"]), headers=first)
                    first = False
                return dump_bytes({"type": type_, "object": obj}) + b"\n"

            def shared(type_: str, c: ChangeRecord, obj: Obj, cells: list[Any]) -> bytes:
                """A change's event as every watch of this kind, namespace and form on this replica
                gets it: encoded by the first, the same bytes for the others."""
                nonlocal first
                key = (kind.plural, c.version, obj["metadata"]["namespace"], form, type_, as_table and first)
                got = surface.encoded.get(key)
                if got is None:
                    return surface.encoded.put(key, event(type_, obj, cells))
                first = False
                return got

            for obj, cells in start:
                known.add(obj["metadata"]["uid"])
                yield event("ADDED", obj, cells)
            version = since
            if initial:
                yield event("BOOKMARK", _bookmark(kind, version, end=True))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            last_mark = loop.time()
            while (left := deadline - loop.time()) > 0:
                try:
                    changes = await surface.hub.after(version, min(left, BOOKMARK_EVERY_S))
                    seen = await surface.objects.changed(kind, a, changes)
                except Expired as exc:
                    yield (
                        dump_bytes(
                            {
                                "type": "ERROR",
                                "object": status_body(410, str(exc), ErrorCode.RESOURCE_VERSION_EXPIRED),
                            }
                        )
                        + b"\n"
                    )
                    return
                except StoreError:
                    await asyncio.sleep(0.5)
                    continue
                if changes:
                    version = changes[-1].version
                for c, shown in seen:
                    if shown is None:
                        gone = await surface.objects.gone(kind, c, a)
                        if gone["metadata"]["uid"] in known or kind is SANDBOX:
                            known.discard(gone["metadata"]["uid"])
                            if by_field(gone):
                                yield shared("DELETED", c, gone, render.gone_cells(kind, gone))
                        continue
                    now, cells = shown
                    if not (by_label(now) and by_field(now)):
                        continue
                    uid = now["metadata"]["uid"]
                    yield shared("MODIFIED" if uid in known else "ADDED", c, now, cells)
                    known.add(uid)
                if bookmarks and loop.time() - last_mark >= BOOKMARK_EVERY_S:
                    last_mark = loop.time()
                    yield event("BOOKMARK", _bookmark(kind, version))

        return StreamingResponse(stream(), media_type="application/json")


def _bookmark(kind: Kind, version: int, *, end: bool = False) -> Obj:
    meta: Obj = {"resourceVersion": str(version)}
    if end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": meta}


def _scale(pool: Obj) -> Obj:
    meta = pool["metadata"]
    return {
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
        },
        "spec": {"replicas": pool["spec"]["replicas"]},
        "status": {"replicas": pool["status"]["readyReplicas"], "selector": pool["status"]["selector"]},
    }


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = _merge(out.get(k), v)
    return out


def _no_dry_run(request: Request) -> None:
    if request.query_params.get("dryRun"):
        raise InvalidRequest("dryRun", "dry runs are not served: corral writes what it is given")


async def _body(request: Request) -> Obj:
    raw = await request.body()
    ctype = request.headers.get("content-type", "")
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        if "yaml" not in ctype:
            raise InvalidRequest("body", "body: not JSON") from None
        body = _yaml(raw)
    if not isinstance(body, dict):
        raise InvalidRequest("body", "body: must be an object")
    return body


def _yaml(raw: bytes) -> Any:
    try:
        import yaml

        return yaml.safe_load(raw)
    except Exception:
        raise InvalidRequest("body", "body: neither JSON nor YAML") from None
