"""Fire N creates at once and see where they landed.

Sequential creates do not reproduce a burst pile-up: the requests have to be in flight together,
inside one cache window. ``run_burst`` does that with ``asyncio.gather`` through the SDK (so refusals
are retried exactly as a real caller's would be), then deletes what it made. ``summarize`` is the pure
arithmetic over the outcomes: the per-host histogram, max/median, refusals by reason, latency.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from corral.client.async_client import AsyncCorral, AsyncSandbox
from corral.client.errors import CorralError, Forbidden, NotFound
from corral.codes import ErrorCode


@dataclass(frozen=True, slots=True)
class BurstCreate:
    """One create of a burst: where it landed (or the code that refused it) and how long it took,
    retries included. ``retried`` counts refusals the SDK absorbed before the final answer."""

    latency_s: float
    host_id: str | None = None
    sandbox_id: str | None = None
    error_code: str | None = None
    retried: Mapping[str, int] = field(default_factory=dict)
    error_message: str | None = None  # the refusal's message, in the server's words

    @property
    def placed(self) -> bool:
        return self.error_code is None


@dataclass(frozen=True, slots=True)
class BurstSummary:
    """What a burst did to the fleet.

    ``median`` is over hosts, zero-count hosts included when the host list was known, because a pile-up
    shows precisely as one tall bar and a row of empty ones. ``max_to_median`` is ``None`` when the
    median is 0 (most hosts got nothing: the ratio is unbounded); ``max_to_mean`` stays finite.
    """

    requested: int
    placed: int
    per_host: dict[str, int]
    max: int
    median: float
    mean: float
    max_to_median: float | None
    max_to_mean: float | None
    refusals: dict[str, int]
    retried: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None
    # One message for each refusal code: what the server said, so a refusal says why in words.
    reasons: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "placed": self.placed,
            "per_host": dict(self.per_host),
            "hosts": len(self.per_host),
            "max": self.max,
            "median": self.median,
            "mean": self.mean,
            "max_to_median": self.max_to_median,
            "max_to_mean": self.max_to_mean,
            "refusals": dict(self.refusals),
            "retried": dict(self.retried),
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "reasons": dict(self.reasons),
        }


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in [0, 100]): always a value that was observed."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be within [0, 100], got {q}")
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summarize(outcomes: Iterable[BurstCreate], hosts: Iterable[str] | None = None) -> BurstSummary:
    """The burst's numbers. With ``hosts``, every listed host appears in ``per_host`` (0 if it got
    nothing); hosts that received a sandbox but were not listed are added, never dropped."""
    results = list(outcomes)
    per_host: Counter[str] = Counter({h: 0 for h in hosts or ()})
    refusals: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    retried: Counter[str] = Counter()
    latencies_ms: list[float] = []
    for outcome in results:
        retried.update(outcome.retried)
        if outcome.placed:
            per_host[outcome.host_id or "(unknown)"] += 1
            latencies_ms.append(outcome.latency_s * 1000.0)
        else:
            code = outcome.error_code or ErrorCode.ERROR
            refusals[code] += 1
            if outcome.error_message:
                reasons.setdefault(code, outcome.error_message)

    counts = list(per_host.values())
    top = max(counts, default=0)
    median = float(statistics.median(counts)) if counts else 0.0
    mean = statistics.fmean(counts) if counts else 0.0
    return BurstSummary(
        requested=len(results),
        placed=len(latencies_ms),
        per_host=dict(sorted(per_host.items(), key=lambda kv: (-kv[1], kv[0]))),
        max=top,
        median=median,
        mean=mean,
        max_to_median=top / median if median > 0 else None,
        max_to_mean=top / mean if mean > 0 else None,
        refusals=dict(refusals.most_common()),
        retried=dict(retried.most_common()),
        p50_ms=percentile(latencies_ms, 50),
        p99_ms=percentile(latencies_ms, 99),
        reasons=reasons,
    )


@dataclass(frozen=True, slots=True)
class BurstReport:
    """A finished burst: its summary, and how the clean-up went."""

    summary: BurstSummary
    outcomes: list[BurstCreate]
    deleted: int
    delete_failures: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        out = self.summary.to_json()
        out["deleted"] = self.deleted
        out["delete_failures"] = dict(self.delete_failures)
        return out


async def fleet_host_ids(client: AsyncCorral) -> list[str] | None:
    """The fleet's host ids, or ``None`` when this token may not list hosts (an admin route) or the
    server does not offer the route."""
    try:
        hosts = await client.hosts.list()
    except (Forbidden, NotFound):
        return None
    return [h.id for h in hosts]


async def run_burst(
    client: AsyncCorral,
    count: int,
    *,
    template: str,
    memory_mb: int | None = None,
    ttl_seconds: int | None = None,
    deadline_s: float | None = None,
    wait_s: float | None = None,
    cleanup: bool = True,
    timer: Callable[[], float] = time.perf_counter,
) -> BurstReport:
    """Fire ``count`` concurrent creates, summarize where they landed, then delete them.

    Host listing comes first: it includes zero-count hosts in the histogram and fails fast (as
    ``Unreachable``) when there is no server, before any create is sent.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    host_ids = await fleet_host_ids(client)
    created: list[AsyncSandbox] = []

    async def one(i: int) -> BurstCreate:
        started = timer()
        try:
            sandbox = await client.sandboxes.create(
                template,
                memory_mb=memory_mb,
                ttl_seconds=ttl_seconds,
                metadata={"burst": "corral-burst", "i": str(i)},
                deadline_s=deadline_s,
                wait=wait_s,
            )
        except CorralError as exc:
            retried: Mapping[str, int] = getattr(exc, "refusals", {})
            # The final refusal is reported under refusals; count only the ones that were retried.
            absorbed = Counter(retried)
            absorbed[exc.code] -= 1
            return BurstCreate(
                latency_s=timer() - started,
                error_code=exc.code,
                retried=dict(+absorbed),
                error_message=exc.message,
            )
        created.append(sandbox)
        stats = sandbox.create_stats
        return BurstCreate(
            latency_s=timer() - started,
            host_id=sandbox.host_id,
            sandbox_id=sandbox.id,
            retried=dict(stats.refusals) if stats else {},
        )

    try:
        gathered = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
    finally:
        deleted, delete_failures = (await _delete_all(created)) if cleanup else (0, Counter[str]())
    outcomes: list[BurstCreate] = []
    for item in gathered:
        if isinstance(item, BaseException):
            raise item  # a bug, not a refusal: surfaced after the clean-up so nothing leaks
        outcomes.append(item)
    return BurstReport(
        summary=summarize(outcomes, host_ids),
        outcomes=outcomes,
        deleted=deleted,
        delete_failures=dict(delete_failures),
    )


async def _delete_all(sandboxes: Sequence[AsyncSandbox]) -> tuple[int, Counter[str]]:
    async def kill(sandbox: AsyncSandbox) -> str | None:
        try:
            await sandbox.kill()
        except NotFound:
            return None  # already gone counts as deleted
        except CorralError as exc:
            return exc.code
        return None

    codes = await asyncio.gather(*(kill(s) for s in sandboxes))
    failures = Counter(code for code in codes if code is not None)
    return len(sandboxes) - sum(failures.values()), failures
