"""Why nothing was placed. Both refusals are retryable and distinct: one says "come back in a moment",
the other says "your fleet is gone" and should page a human."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from corral.codes import ErrorCode


class Refusal(Exception):
    code: str = "refused"
    retryable: bool = True

    def __init__(
        self,
        reasons: Mapping[str, int],
        checked: int,
        message: str | None = None,
        rejected: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.reasons = dict(reasons)
        self.checked = checked
        # (host id, filter) for the first hosts rejected: the refusal's explanation, bounded.
        self.rejected = tuple(rejected)
        super().__init__(message or self.describe())

    def describe(self) -> str:
        parts = ", ".join(f"{n} {r}" for r, n in sorted(self.reasons.items(), key=lambda kv: (-kv[1], kv[0])))
        return f"{self.code}: {self.checked} hosts checked" + (f": {parts}" if parts else "")


class NoCapacity(Refusal):
    """Live hosts exist; none fits now."""

    code = ErrorCode.NO_CAPACITY


class NoHealthyHosts(Refusal):
    """No host has a fresh heartbeat."""

    code = ErrorCode.NO_HEALTHY_HOSTS
