"""Re-sealing after a key rotation: every sealed spec not under the newest key is opened with the key
it was sealed under and sealed again under the newest, one compare-and-set each (a spec changed
meanwhile is left for the next run). Afterwards the old key can be removed."""

from __future__ import annotations

from dataclasses import dataclass

from corral.control.ports import SealedSpecs
from corral.control.seal import Sealer

PAGE = 500


@dataclass(frozen=True, slots=True)
class ResealReport:
    checked: int
    resealed: int


async def reseal_all(store: SealedSpecs, sealer: Sealer) -> ResealReport:
    checked = resealed = 0
    after = ""
    while True:
        page = await store.sealed_specs(after, PAGE)
        if not page:
            return ResealReport(checked, resealed)
        for sandbox_id, sealed in page:
            checked += 1
            fresh = sealer.reseal(sandbox_id, sealed)
            if fresh is not None and await store.replace_sealed_spec(sandbox_id, sealed, fresh):
                resealed += 1
        after = page[-1][0]
