"""Soft preferences among feasible hosts. Scores are normalised to roughly [0, 1] per term so weights
mean what they say; higher is better."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from corral.core.admission import DEFAULT_POLICY, AdmissionPolicy, BoundFn, render_headroom
from corral.core.fit import CPU, MEMORY, Bound
from corral.core.types import CreateRequest, HostView, Pending


class Strategy(StrEnum):
    SPREAD = "spread"  # prefer the emptiest host: flat fleet, room for spikes (the default)
    PACK = "pack"  # prefer the fullest host that fits: lets hosts drain and be retired


@dataclass(frozen=True, slots=True)
class ScoreWeights:
    memory: float = 0.7
    cpu: float = 0.3
    # A soft preference, small next to memory and cpu: a host that can stream-restore boots without
    # first downloading the whole memory file.
    stream_restore: float = 0.05
    # A host that holds the request's image starts it without fetching it first (the seeds' "restores
    # faster" bonus). Smaller than one typical sandbox's share of a host, so it breaks near-ties toward
    # the hosts that have the image without piling a burst onto them; a host without it still takes
    # the create (at the cost of one fetch), never refused for it.
    image: float = 0.02


@dataclass(frozen=True, slots=True)
class Scorer:
    strategy: Strategy = Strategy.SPREAD
    weights: ScoreWeights = ScoreWeights()
    policy: AdmissionPolicy = DEFAULT_POLICY
    # Scored for every candidate of every decision: the headroom, compiled once from ``weighted``.
    _headroom: BoundFn = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_headroom", render_headroom(self.weighted()))

    def headroom(self, host: HostView, pending: Pending, req: CreateRequest) -> float:
        """Fraction of the host left after this request and everything pending (AerolVM's headroom):
        what each bound of the fit rule leaves, over the host's total, weighted."""
        return self._headroom(host, pending, req, self.policy)

    def weighted(self) -> tuple[tuple[Bound, float], ...]:
        """The bounds the headroom counts, with their weights (the store ranks by the same terms)."""
        return ((MEMORY, self.weights.memory), (CPU, self.weights.cpu))

    def score(self, host: HostView, pending: Pending, req: CreateRequest) -> float:
        h = self.headroom(host, pending, req)
        s = h if self.strategy is Strategy.SPREAD else -h
        if host.stream_restore:
            s += self.weights.stream_restore
        if req.image is not None and req.image in host.images:
            s += self.weights.image
        return s
