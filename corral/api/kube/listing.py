"""Lists of sandboxes and claims a page at a time (``limit``/``continue``, :mod:`.paging`), read as
the store's summaries: one query a page of only the columns a Table shows, each row's metadata and
cells rendered straight from it. The whole records are read (one more query) only when the answer
holds whole objects: a JSON list, or a Table with ``includeObject=Object``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from corral.api.kube import render
from corral.api.kube.access import Access
from corral.api.kube.kinds import CLAIM, Kind
from corral.api.kube.objects import Objects, Shown
from corral.api.kube.paging import ContinueTokens, Position, limit_of
from corral.store import MAX_SUMMARIES, SandboxState, SandboxSummary

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class RowPage:
    rows: list[tuple[SandboxSummary, Obj]]  # each sandbox's summary and its metadata
    version: int  # the list's resourceVersion: its first page's
    more: str | None  # the next page's ``continue`` token; None: this is the last


def scope_of(a: Access) -> str:
    """The list a token continues: one namespace's (its tenant), or all of them."""
    if a.tenant is not None:
        return a.tenant.id
    return f"ns/{a.namespace}" if a.namespace is not None else "*"


class SandboxLists:
    def __init__(self, objects: Objects) -> None:
        self.objects = objects
        self.tokens = ContinueTokens(objects.plane.store)

    async def page(
        self,
        kind: Kind,
        a: Access,
        version: int,
        limit_text: str | None,
        token: str | None,
        keep: Callable[[Obj], bool],
    ) -> RowPage:
        """The page ``token`` continues (the first without one): up to ``limit`` of the sandboxes
        (or claims) ``a`` sees whose metadata ``keep`` takes, in the store's listing order."""
        limit = limit_of(limit_text, MAX_SUMMARIES)
        scope = scope_of(a)
        after = None
        if token:
            at = await self.tokens.read(token, scope, kind.plural)
            version, after = at.version, at.after
        chunk = min(limit + 1, MAX_SUMMARIES) if limit is not None else MAX_SUMMARIES
        names: dict[str, str] = {}
        rows: list[tuple[SandboxSummary, Obj]] = []
        more = False
        while not more:
            got = await self.objects.summaries(a, after, chunk)
            for s in got:
                if kind is CLAIM and not render.is_claim(s):
                    continue
                ns = names.get(s.tenant_id)
                if ns is None:
                    ns = names[s.tenant_id] = await self.objects.ns.name_of(s.tenant_id)
                meta = render.sandbox_meta(kind, s, ns, version)
                if not keep({"metadata": meta}):
                    continue
                if limit is not None and len(rows) == limit:
                    more = True
                    break
                rows.append((s, meta))
            if len(got) < chunk:
                break
            after = got[-1].position
        next_token = None
        if more:
            next_token = await self.tokens.issue(scope, kind.plural, Position(version, rows[-1][0].position))
        return RowPage(rows, version, next_token)

    async def objects_of(self, kind: Kind, page: RowPage) -> list[Shown]:
        """The page's sandboxes as whole objects, with their cells, from their records as they are
        now (one read); one deleted since is left out."""
        records = await self.objects.plane.store.get_sandboxes([s.id for s, _ in page.rows])
        out = []
        for s, meta in page.rows:
            rec = records.get(s.id)
            if rec is not None and rec.state is not SandboxState.DELETED:
                out.append(self.objects.show_sandbox(kind, rec, meta["namespace"], page.version))
        return out
