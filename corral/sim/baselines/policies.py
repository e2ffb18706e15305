"""Placement policies by name: which core selector a replica runs, whose ledger it reserves in, and
what the agent enforces on its own side. Each is a composition of core parts, never a copy of one.

A policy that is a configuration corral itself runs (``flow_k`` set) is run through corral's real
create flow, store model and agents (:mod:`corral.sim.flow.real_fleet`); the others are models of other
schedulers (no ledger, per-replica ledgers, an agent without a gate), run by :mod:`corral.sim.baselines.fleet`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from corral.core import FullScan, Jitter, Naive, PowerOfK, Selector


class LedgerScope(StrEnum):
    NONE = "none"  # no in-flight accounting: the view is all a replica knows
    REPLICA = "replica"  # one ledger per replica process: each accounts for its own in-flight creates
    SHARED = "shared"  # one ledger for every replica (the store's reservations table)


# The agent-side starts limiter of the corral policy: concurrent starts per host, as in E2B's
# orchestrator (3), and well below the eight a snapshot-restoring host can take without thrashing its
# page cache; a refusal is retried on another host at once.
CORRAL_STARTS_LIMIT = 4


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    selector: Callable[[], Selector]
    ledger: LedgerScope
    # The agent enforces its own admission arithmetic and (optionally) a starts limiter.
    agent_gate: bool
    starts_limit: int | None
    summary: str
    # Candidates per decision when corral's own create flow runs this policy (its ``k``; 0: every
    # host; "auto": corral's own default, ``candidate_limit``). None: a model of another scheduler,
    # not a configuration of corral's.
    flow_k: int | Literal["auto"] | None = None

    @property
    def is_model(self) -> bool:
        return self.flow_k is None

    @property
    def control_k(self) -> int | None:
        """The create flow's ``ControlConfig.k`` for this policy (None: corral's default)."""
        return self.flow_k if isinstance(self.flow_k, int) else None

    @property
    def engine(self) -> str:
        """What runs it: corral's own create flow, or the fleet model of another scheduler."""
        return "model" if self.is_model else "create_flow"


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            "naive",
            Naive,
            LedgerScope.NONE,
            False,
            None,
            "argmax over the cached view, no ledger, agents start whatever they are sent (the pile-up)",
        ),
        Policy(
            "jitter",
            Jitter,
            LedgerScope.NONE,
            False,
            None,
            "argmax over scores perturbed by +/-2%, ties broken at random",
        ),
        Policy(
            "reservations",
            Naive,
            LedgerScope.REPLICA,
            False,
            None,
            "argmax minus an in-flight ledger held by each replica process",
        ),
        Policy(
            "power_of_2",
            lambda: PowerOfK(k=2),
            LedgerScope.NONE,
            False,
            None,
            "best of two hosts sampled at random, no ledger",
        ),
        Policy(
            "shared_ledger",
            Naive,
            LedgerScope.SHARED,
            False,
            None,
            "argmax minus one in-flight ledger shared by every replica",
        ),
        Policy(
            "corral",
            lambda: PowerOfK(k=2),
            LedgerScope.SHARED,
            True,
            CORRAL_STARTS_LIMIT,
            "corral as it ships: power-of-K sampling (every host of a small fleet) + a shared ledger "
            "+ the agent's own gate and starts limiter",
            flow_k="auto",
        ),
        Policy(
            "random",
            lambda: PowerOfK(k=1),
            LedgerScope.NONE,
            False,
            None,
            "one feasible host chosen uniformly at random, no ledger",
        ),
        Policy(
            "full_scan",
            FullScan,
            LedgerScope.NONE,
            False,
            None,
            "argmax over every host, ties broken at random, no ledger",
        ),
    )
}

BURST_POLICIES = ("naive", "jitter", "reservations", "power_of_2", "shared_ledger", "corral")


def policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICIES)}") from None
