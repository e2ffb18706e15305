"""Soft preferences among feasible hosts. Scores are normalised to roughly [0, 1] per term so weights
mean what they say; higher is better."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from corral.core.admission import DEFAULT_POLICY, AdmissionPolicy, request_charge_mb
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


@dataclass(frozen=True, slots=True)
class Scorer:
    strategy: Strategy = Strategy.SPREAD
    weights: ScoreWeights = ScoreWeights()
    policy: AdmissionPolicy = DEFAULT_POLICY

    def headroom(self, host: HostView, pending: Pending, req: CreateRequest) -> float:
        """Fraction of the host left after this request and everything pending (AerolVM's headroom)."""
        w = self.weights
        mem_total = host.memory_mb_total or 1
        mem_left = (
            host.memory_mb_admittable
            - pending.memory_mb
            - request_charge_mb(req, host.memory_admission, self.policy)
        )
        cpu_total = host.cpu_total or 1.0
        cpu_left = cpu_total - host.cpu_used - pending.cpu - req.cpu
        return w.memory * (mem_left / mem_total) + w.cpu * (cpu_left / cpu_total)

    def score(self, host: HostView, pending: Pending, req: CreateRequest) -> float:
        h = self.headroom(host, pending, req)
        s = h if self.strategy is Strategy.SPREAD else -h
        if host.stream_restore:
            s += self.weights.stream_restore
        return s
