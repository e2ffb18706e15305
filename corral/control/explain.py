"""Why one create went where it went, kept compactly: for each attempt, the hosts the placer sampled and
their scores, the filter that rejected each host it turned away, the hosts it offered the store and the
one the store took by its current totals; then the outcome. The same document is stored with a placed
sandbox and sent in a refused create's 503 ``details``.

Bounded by construction: at most ``SMALL_FLEET`` candidates and ``MAX_REJECTED`` rejections per
attempt, at most the create's attempt limit of attempts.
"""

from __future__ import annotations

import json
from typing import Any

from corral.codes import ErrorCode
from corral.control.errors import ResourceNotFound
from corral.control.ports import Placements
from corral.core import CreateRequest, Decision, Refusal
from corral.jsontext import dumps
from corral.store import RecordNotFound

VERSION = 1
# What the store's choice among the offered candidates rests on (the store's ``reserve_best``).
STORE_RULE = "most room by the store's current reserved totals (memory and CPU fractions)"
SCORE_DIGITS = 4
_ENCODE = dumps


class Attempt:
    """One pass of the create flow. Kept compact (hosts and scores as pairs, rejections as pairs):
    the stored form; ``expand`` turns it into the readable one."""

    __slots__ = ("doc",)

    def __init__(self, decision: Decision) -> None:
        self.doc: dict[str, Any] = {
            "view_age_s": round(decision.view_age_s, 3),
            "checked": decision.checked,
            "candidates": [
                [h.id, round(s, SCORE_DIGITS)]
                for h, s in zip(decision.candidates, decision.scores, strict=False)
            ],
            "rejected": [list(r) for r in decision.rejected],
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
        }

    def tried(self, attempt: Attempt) -> None:
        """One more pass: a plan the placement step is about to apply."""
        self.attempts.append(attempt)

    def placed(self, host_id: str, reservation_id: str) -> None:
        self.attempts[-1].doc["outcome"] = "placed"
        self.doc.update(outcome="placed", host=host_id, reservation_id=reservation_id)

    def refused(self, refusal: Refusal | None, code: str, reasons: dict[str, int]) -> None:
        out: dict[str, Any] = {"code": code, "reasons": reasons}
        if refusal is not None:
            out["checked"] = refusal.checked
            out["rejected"] = [list(r) for r in refusal.rejected]
        self.doc.update(outcome="refused", refusal=out)

    def compact(self) -> dict[str, Any]:
        return {**self.doc, "attempts": [a.doc for a in self.attempts]}

    def as_dict(self) -> dict[str, Any]:
        return expand(self.compact())

    def to_json(self) -> str:
        return _ENCODE(self.compact())


def _rejections(pairs: list[list[str]]) -> list[dict[str, str]]:
    return [{"host": h, "filter": f} for h, f in pairs]


def expand(doc: dict[str, Any]) -> dict[str, Any]:
    """The readable explanation of a compact one: named fields, the store's rule, and why."""
    out = {**doc, "store_rule": STORE_RULE}
    attempts = []
    for a in doc.get("attempts", []):
        attempts.append(
            {
                **a,
                "candidates": [{"host": h, "score": s} for h, s in a.get("candidates", [])],
                "rejected": _rejections(a.get("rejected", [])),
            }
        )
    out["attempts"] = attempts
    if "refusal" in doc:
        out["refusal"] = {**doc["refusal"], "rejected": _rejections(doc["refusal"].get("rejected", []))}
    host = doc.get("host")
    if doc.get("outcome") == "placed" and attempts:
        first = attempts[-1].get("placer_choice")
        if first == host:
            why = f"{host} led the placer's sample and the store agreed by its current totals"
        else:
            why = (
                f"the placer's view ranked {first} first; the store took {host}, "
                "the offered candidate with the most room by its current totals"
            )
        if len(attempts) > 1:
            why += f" (attempt {len(attempts)})"
        out["why"] = why
    return out


async def explained(store: Placements, sandbox_id: str, tenant_id: str | None) -> str:
    """The stored explanation (JSON text) of ``sandbox_id`` as ``tenant_id`` may see it (None: any)."""
    try:
        doc = await store.get_placement(sandbox_id, tenant_id=tenant_id)
    except RecordNotFound:
        raise ResourceNotFound(f"no sandbox {sandbox_id}") from None
    if doc is None:
        raise ResourceNotFound(
            f"no placement explanation is kept for {sandbox_id} (placed before explanations were kept)",
            code=ErrorCode.NO_PLACEMENT_RECORD,
        )
    return _ENCODE(expand(json.loads(doc)))
