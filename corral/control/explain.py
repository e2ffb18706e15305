"""Why one create went where it went, kept compactly: for each attempt, the hosts the placer sampled and
their scores, the filter that rejected each host it turned away, the hosts it offered the store and the
one the store took by its current totals; then the outcome. The same document is stored with a placed
sandbox and sent in a refused create's 503 ``details``.

Bounded by construction: at most ``MAX_CANDIDATES`` candidates and ``MAX_REJECTED`` rejections per
attempt, at most the create's attempt limit of attempts.
"""

from __future__ import annotations

import json
from typing import Any

from corral.control.errors import NotFound
from corral.core import CreateRequest, Decision, Refusal
from corral.store import NotFound as StoreNotFound
from corral.store import Store

VERSION = 1
# What the store's choice among the offered candidates rests on (the store's ``reserve_best``).
STORE_RULE = "most room by the store's current reserved totals (memory and CPU fractions)"
SCORE_DIGITS = 4


class Attempt:
    __slots__ = ("doc",)

    def __init__(self, decision: Decision) -> None:
        self.doc: dict[str, Any] = {
            "view_age_s": round(decision.view_age_s, 3),
            "checked": decision.checked,
            "candidates": [
                {"host": h.id, "score": round(s, SCORE_DIGITS)}
                for h, s in zip(decision.candidates, decision.scores, strict=False)
            ],
            "rejected": [{"host": h, "filter": f} for h, f in decision.rejected],
            "placer_choice": decision.host.id,
            "charge_mb": decision.charge_mb,
        }

    def offered(self, hosts: list[str]) -> None:
        self.doc["offered_to_store"] = hosts

    def took(self, host_id: str | None) -> None:
        self.doc["store_choice"] = host_id
        if host_id is None:
            self.doc["outcome"] = "store_no_room"

    def outcome(self, what: str) -> None:
        self.doc["outcome"] = what


class Explanation:
    """Built along one create; ``to_json`` is what the store keeps, ``as_dict`` what a 503 carries."""

    __slots__ = ("attempts", "doc")

    def __init__(self, req: CreateRequest) -> None:
        self.attempts: list[Attempt] = []
        self.doc: dict[str, Any] = {
            "v": VERSION,
            "request": {"memory_mb": req.memory_mb, "cpus": req.cpu, "stateful": req.stateful},
            "store_rule": STORE_RULE,
        }

    def decided(self, decision: Decision) -> Attempt:
        a = Attempt(decision)
        self.attempts.append(a)
        return a

    def placed(self, host_id: str, reservation_id: str) -> None:
        last = self.attempts[-1].doc
        last["outcome"] = "placed"
        self.doc.update(outcome="placed", host=host_id, reservation_id=reservation_id)
        if last.get("placer_choice") == host_id:
            why = f"{host_id} led the placer's sample and the store agreed by its current totals"
        else:
            why = (
                f"the placer's view ranked {last.get('placer_choice')} first; the store took {host_id}, "
                "the offered candidate with the most room by its current totals"
            )
        if len(self.attempts) > 1:
            why += f" (attempt {len(self.attempts)})"
        self.doc["why"] = why

    def refused(self, refusal: Refusal | None, code: str, reasons: dict[str, int]) -> None:
        out: dict[str, Any] = {"code": code, "reasons": reasons}
        if refusal is not None:
            out["checked"] = refusal.checked
            out["rejected"] = [{"host": h, "filter": f} for h, f in refusal.rejected]
        self.doc.update(outcome="refused", refusal=out)

    def as_dict(self) -> dict[str, Any]:
        return {**self.doc, "attempts": [a.doc for a in self.attempts]}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), separators=(",", ":"))


async def explained(store: Store, sandbox_id: str, tenant_id: str | None) -> str:
    """The stored explanation (JSON text) of ``sandbox_id`` as ``tenant_id`` may see it (None: any)."""
    try:
        doc = await store.get_placement(sandbox_id, tenant_id=tenant_id)
    except StoreNotFound:
        raise NotFound(f"no sandbox {sandbox_id}") from None
    if doc is None:
        raise NotFound(
            f"no placement explanation is kept for {sandbox_id} (placed before explanations were kept)",
            code="no_placement_record",
        )
    return doc
