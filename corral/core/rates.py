"""Token buckets: how fast a key (a tenant) may ask, as a rate and a burst. Pure: ``now`` is an argument.

A bucket holds at most ``burst`` tokens and gains ``rate_per_s`` a second; each request takes some. A
request the bucket cannot pay for takes nothing and is told when it could be paid: the refusal's
Retry-After is computed from the bucket, not guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rate:
    """``rate_per_s`` tokens a second, at most ``burst`` held (so at most ``burst`` at once)."""

    rate_per_s: float
    burst: int

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rate_per_s) and self.rate_per_s > 0):
            raise ValueError(f"rate_per_s must be a finite number > 0, got {self.rate_per_s!r}")
        if self.burst < 1:
            raise ValueError(f"burst must be >= 1, got {self.burst!r}")

    @classmethod
    def of(cls, rate_per_s: float, burst: int | None = None) -> Rate:
        """A rate whose burst, when not named, is one second's worth of it (at least one request)."""
        return cls(rate_per_s, burst if burst is not None else max(1, math.ceil(rate_per_s)))

    def share(self, parts: int) -> Rate:
        """One of ``parts`` equal shares (each of several replicas enforcing the sum): the rate divided,
        the burst divided but never below one request."""
        parts = max(1, parts)
        return Rate(self.rate_per_s / parts, max(1, self.burst // parts))


@dataclass(frozen=True, slots=True)
class Refused:
    """Why a request was not paid: it may be paid in ``retry_after_s`` (never when it asks for more
    than the bucket can ever hold: ``math.inf``)."""

    rate: Rate
    cost: int
    retry_after_s: float


class TokenBucket:
    """One key's bucket. Starts full; time going backwards (a clock step) adds nothing."""

    __slots__ = ("_at", "_tokens", "rate")

    def __init__(self, rate: Rate, now: float) -> None:
        self.rate = rate
        self._tokens = float(rate.burst)
        self._at = now

    def _refill(self, now: float) -> None:
        if now > self._at:
            self._tokens = min(float(self.rate.burst), self._tokens + (now - self._at) * self.rate.rate_per_s)
            self._at = now

    def tokens(self, now: float) -> float:
        self._refill(now)
        return self._tokens

    def retune(self, rate: Rate, now: float) -> None:
        """A new rate from now on; the tokens held are kept, capped at the new burst."""
        self._refill(now)
        self.rate = rate
        self._tokens = min(self._tokens, float(rate.burst))

    def take(self, now: float, cost: int = 1) -> Refused | None:
        """Pay ``cost`` tokens: None when paid, else when it could be (nothing is taken then)."""
        if cost < 1:
            raise ValueError(f"cost must be >= 1, got {cost}")
        self._refill(now)
        if self._tokens >= cost:
            self._tokens -= cost
            return None
        if cost > self.rate.burst:
            return Refused(self.rate, cost, math.inf)
        return Refused(self.rate, cost, (cost - self._tokens) / self.rate.rate_per_s)

    def spend(self, now: float, cost: float) -> None:
        """Pay ``cost`` whatever is held: the bucket may go into debt, which time repays before it
        holds a token again (for work already done, such as bytes read, that must be paid for)."""
        self._refill(now)
        self._tokens -= cost

    def full(self, now: float) -> bool:
        return self.tokens(now) >= self.rate.burst


class Buckets:
    """A bucket per key. A full bucket is the same as none, so full ones are dropped when the table
    grows past ``max_keys``: its size is bounded by the keys that asked recently, not all that ever did."""

    def __init__(self, max_keys: int = 10_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be >= 1")
        self.max_keys = max_keys
        self._buckets: dict[str, TokenBucket] = {}

    def take(self, key: str, rate: Rate, now: float, cost: int = 1) -> Refused | None:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._sweep(now)
            bucket = self._buckets[key] = TokenBucket(rate, now)
        elif bucket.rate != rate:
            bucket.retune(rate, now)
        return bucket.take(now, cost)

    def _sweep(self, now: float) -> None:
        full = [k for k, b in self._buckets.items() if b.full(now)]
        for k in full:
            del self._buckets[k]
        if len(self._buckets) >= self.max_keys:
            # Every bucket is draining: forget the fullest (the one that forgets least).
            del self._buckets[max(self._buckets, key=lambda k: self._buckets[k].tokens(now))]

    def __len__(self) -> int:
        return len(self._buckets)
