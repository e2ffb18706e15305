"""The agent's warm book: which of its sandboxes wait, unowned, in a pool, which are starting for one,
and which left a pool for a create. Pure bookkeeping, no I/O: a claim is one pop from a dict.

Invariant: for each template, ready + starting <= target at the moment a start is decided (a start is
counted as starting before its first await), so a host never holds more warm sandboxes than its target
plus the starts in flight, however slow those starts are. A lowered target is met by stopping ready
ones, never by waiting for starts to finish.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from corral.agent.protocol import ROLE_CLAIMED, ROLE_WARM, WarmCount, WarmTarget

# Upper bounds of the agent-side claim latency histogram, in seconds (a hand-over is microseconds).
CLAIM_BUCKETS_S = (0.00001, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.005)


@dataclass(slots=True)
class WarmStats:
    claims: int = 0
    empty: int = 0
    replenish_starts: int = 0
    replenish_failures: int = 0
    evictions: int = 0
    claim_seconds_sum: float = 0.0
    # Claims per bucket of CLAIM_BUCKETS_S (the last counts the ones above every bound).
    claim_buckets: list[int] = field(default_factory=lambda: [0] * (len(CLAIM_BUCKETS_S) + 1))

    def observe_claim(self, seconds: float) -> None:
        self.claim_seconds_sum += seconds
        i = next((i for i, b in enumerate(CLAIM_BUCKETS_S) if seconds <= b), len(CLAIM_BUCKETS_S))
        self.claim_buckets[i] += 1


class WarmBook:
    def __init__(self) -> None:
        self.targets: dict[str, WarmTarget] = {}
        # Ready sandboxes per template, oldest first (a dict keeps insertion order and pops in O(1)).
        self._ready: dict[str, dict[str, None]] = {}
        self._template_of: dict[str, str] = {}
        self._starting: dict[str, int] = {}
        # Claimed sandboxes and the environment their claim asked for (every later exec gets it).
        self._claimed: dict[str, dict[str, str]] = {}
        self.stats = WarmStats()

    # -- targets ------------------------------------------------------------------------------------

    def set_targets(self, targets: Iterable[WarmTarget]) -> None:
        self.targets = {t.template: t for t in targets if t.target > 0}

    def target(self, template: str) -> int:
        t = self.targets.get(template)
        return t.target if t is not None else 0

    def ready_count(self, template: str) -> int:
        return len(self._ready.get(template, ()))

    def starting_count(self, template: str) -> int:
        return self._starting.get(template, 0)

    def deficit(self, template: str) -> int:
        """How many more starts the target allows now."""
        return self.target(template) - self.ready_count(template) - self.starting_count(template)

    def surplus(self) -> list[str]:
        """Ready sandboxes beyond their template's target (the newest first): to be stopped."""
        out: list[str] = []
        for template, ids in self._ready.items():
            extra = len(ids) + self.starting_count(template) - self.target(template)
            if extra > 0:
                out.extend(list(ids)[::-1][: min(extra, len(ids))])
        return out

    # -- starts -------------------------------------------------------------------------------------

    def starting(self, template: str) -> None:
        self._starting[template] = self._starting.get(template, 0) + 1

    def started(self, template: str, sandbox_id: str | None) -> None:
        """A start ended: ``sandbox_id`` is ready, or None if the start failed."""
        n = self._starting.get(template, 0) - 1
        if n > 0:
            self._starting[template] = n
        else:
            self._starting.pop(template, None)
        if sandbox_id is not None:
            self._ready.setdefault(template, {})[sandbox_id] = None
            self._template_of[sandbox_id] = template

    # -- claims and removals ------------------------------------------------------------------------

    def pop(self, template: str, env: Mapping[str, str]) -> str | None:
        """Hand over one ready sandbox (the oldest): from now on it is claimed, never warm again."""
        ids = self._ready.get(template)
        if not ids:
            self.stats.empty += 1
            return None
        sandbox_id = next(iter(ids))
        del ids[sandbox_id]
        del self._template_of[sandbox_id]
        self._claimed[sandbox_id] = dict(env)
        self.stats.claims += 1
        return sandbox_id

    def take_ready(self, sandbox_id: str) -> bool:
        """Remove a ready sandbox from the pool (to be stopped or evicted); False if it is not one."""
        template = self._template_of.pop(sandbox_id, None)
        if template is None:
            return False
        del self._ready[template][sandbox_id]
        return True

    def forget(self, sandbox_id: str) -> None:
        """The sandbox is gone, whatever it was."""
        self.take_ready(sandbox_id)
        self._claimed.pop(sandbox_id, None)

    def evictable(self) -> Iterator[str]:
        """Ready sandboxes in the order a real create takes their room: the template furthest over
        its target first, then the newest of each."""
        for template in sorted(self._ready, key=lambda t: self.target(t) - len(self._ready[t])):
            yield from list(self._ready[template])[::-1]

    # -- what a heartbeat says ----------------------------------------------------------------------

    def env(self, sandbox_id: str) -> Mapping[str, str]:
        return self._claimed.get(sandbox_id, {})

    def role(self, sandbox_id: str) -> str | None:
        if sandbox_id in self._template_of:
            return ROLE_WARM
        if sandbox_id in self._claimed:
            return ROLE_CLAIMED
        return None

    def roles(self) -> dict[str, str]:
        out = dict.fromkeys(self._template_of, ROLE_WARM)
        out.update(dict.fromkeys(self._claimed, ROLE_CLAIMED))
        return out

    def counts(self) -> dict[str, WarmCount]:
        templates = set(self._ready) | set(self._starting) | set(self.targets)
        return {
            t: WarmCount(ready=self.ready_count(t), starting=self.starting_count(t))
            for t in sorted(templates)
            if self.ready_count(t) or self.starting_count(t) or self.target(t)
        }

    def ready_ids(self) -> Iterator[str]:
        return iter(self._template_of)
