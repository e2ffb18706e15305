"""When to try a refused create again: one policy, shared by the sync and the async client.

``RetryPolicy`` is pure: given the retry number, the server's Retry-After hint and a random source it
returns a delay. ``RetryBudget`` holds one logical create's bookkeeping (attempts, first refusal,
refusals by code) against an injected clock and decides "sleep this long" or "give up". The clients
only perform the I/O and the sleeping.

Full jitter (``uniform(0, window)``) rather than exponential-plus-a-little-noise: clients refused in the
same instant must not come back in the same instant, or the retry is itself the next burst.

With a Retry-After hint the server's estimate is a *floor* (coming back sooner is wasted work for both
sides) and full jitter over the same exponential window is added on top. So a hinted wave is smeared
exactly as widely as an unhinted one, and persistent refusal still backs off exponentially rather than
knocking every ``Retry-After`` seconds in step with everyone else.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from corral.client.errors import CapacityUnavailable, CorralError, Unreachable

# Reads seconds; the SDK uses only differences between readings (its deadline, ``first_refusal_at``),
# so the default is ``time.monotonic``, not the server's wall-clock ``corral.core.Clock``.
TimeSource = Callable[[], float]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by a deadline.

    ``base_s * 2**n`` capped at ``cap_s`` is the window of retry ``n`` (0-based); ``deadline_s`` is the
    caller's patience for one logical create, from its first attempt.
    """

    base_s: float = 0.25
    cap_s: float = 8.0
    deadline_s: float = 90.0

    def __post_init__(self) -> None:
        for name in ("base_s", "cap_s", "deadline_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.cap_s < self.base_s:
            raise ValueError(f"cap_s ({self.cap_s}) must be >= base_s ({self.base_s})")

    def window(self, retry: int) -> float:
        """The full-jitter window of retry ``retry``: ``min(cap, base * 2**retry)``."""
        if retry < 0:
            raise ValueError("retry numbers start at 0")
        # 2**retry overflows float for absurd retry counts; the cap is reached long before.
        if retry >= 64:
            return self.cap_s
        return min(self.cap_s, self.base_s * 2.0**retry)

    def delay(self, retry: int, retry_after_s: float | None, rng: random.Random) -> float:
        """Seconds to wait before retry ``retry`` (not yet clamped to the deadline)."""
        jitter = rng.uniform(0.0, self.window(retry))
        if retry_after_s is None:
            return jitter
        return max(0.0, retry_after_s) + jitter


def retryable_for_create(error: CorralError) -> bool:
    """Whether a failed create may be sent again. Every create carries one idempotency key across its
    retries, so resending after a lost request or a lost response can never make a second sandbox."""
    return isinstance(error, Unreachable) or error.retryable


class RetryBudget:
    """One logical create's retry bookkeeping. Not thread-safe: one per create call."""

    __slots__ = (
        "_clock",
        "_rng",
        "attempts",
        "first_refusal_at",
        "policy",
        "refusals",
        "started_at",
    )

    def __init__(self, policy: RetryPolicy, clock: TimeSource, rng: random.Random) -> None:
        self.policy = policy
        self._clock = clock
        self._rng = rng
        self.started_at = clock()
        self.attempts = 0
        self.first_refusal_at: float | None = None
        self.refusals: Counter[str] = Counter()

    def attempt(self) -> None:
        """Count an attempt about to be sent."""
        self.attempts += 1

    def elapsed(self) -> float:
        return self._clock() - self.started_at

    def after_refusal(self, error: CorralError) -> float:
        """Record a retryable refusal; return how long to sleep before the next attempt.

        Raises ``CapacityUnavailable`` (chained to ``error``) when the deadline has been reached, or
        ``Unreachable`` when its last attempt did not reach the server at all (a server that is down is
        not a fleet that is full). The returned delay never reaches past the deadline: the last attempt
        is made at the deadline.
        """
        now = self._clock()
        if self.first_refusal_at is None:
            self.first_refusal_at = now
        self.refusals[error.code] += 1
        elapsed = now - self.started_at
        remaining = self.policy.deadline_s - elapsed
        if remaining <= 0:
            raise self.exhausted(error, elapsed) from error
        retry = self.attempts - 1
        return min(self.policy.delay(retry, error.retry_after_s, self._rng), remaining)

    def exhausted(self, error: CorralError, elapsed: float) -> CapacityUnavailable | Unreachable:
        first = self.first_refusal_at if self.first_refusal_at is not None else self.started_at
        seen = ", ".join(f"{n} {code}" for code, n in self.refusals.most_common())
        if isinstance(error, Unreachable):
            gone = Unreachable(
                f"{error.message} (gave up after {self.attempts} attempts in {elapsed:.1f}s: {seen})"
            )
            gone.request_id = error.request_id
            return gone
        out = CapacityUnavailable(
            f"not placed after {self.attempts} attempts in {elapsed:.1f}s ({seen}); last: {error.message}",
            code=error.code,
            attempts=self.attempts,
            elapsed_s=elapsed,
            first_refusal_at=first,
            refusals=self.refusals,
            status=error.status,
            retry_after_s=error.retry_after_s,
            details=error.details,
        )
        out.request_id = error.request_id  # the last attempt's
        return out

    def stats(self) -> CreateStats:
        """What it took to succeed (call on success)."""
        now = self._clock()
        return CreateStats(
            attempts=self.attempts,
            elapsed_s=now - self.started_at,
            refusals=dict(self.refusals),
            refusal_to_success_s=None if self.first_refusal_at is None else now - self.first_refusal_at,
        )


@dataclass(frozen=True, slots=True)
class CreateStats:
    """What one successful create cost: attempts, refusals absorbed by code, and the time from the first
    refusal to success (``None`` when there was no refusal), the number the user actually felt."""

    attempts: int = 1
    elapsed_s: float = 0.0
    refusals: dict[str, int] = field(default_factory=dict)
    refusal_to_success_s: float | None = None
