"""The core's fit rule, spread score and tie-break (``corral.core.fit``) rendered to SQL, for every
statement that reserves capacity on either backend: the store admits exactly what the core's filters
admit, and among the hosts that fit takes the one the core scores best.

The rendering keeps the core's arithmetic: terms added left to right, memory in whole MiB, CPU as the
stored millicores over 1000 and fractions in double precision (``REAL`` is single precision on
PostgreSQL), so the SQL computes the same IEEE numbers the core does.

The policy is the default one: only ``headroom_mb`` is configurable, and it is already inside the
``memory_mb_admittable`` each host publishes.
"""

from __future__ import annotations

from collections.abc import Sequence

from corral.core.admission import DEFAULT_POLICY, AdmissionPolicy
from corral.core.fit import FIT_RULE, TAKES_STATE, Bound, Term, tie_rank
from corral.core.scoring import Scorer, Strategy

DOUBLE = "DOUBLE PRECISION"  # both dialects read it as a double


def terms(host: str = "", mb: str = ":mb", cpu_m: str = ":cpu") -> dict[Term, str]:
    """Each term in SQL: the columns of the host row (``host`` prefixes them, e.g. ``"hosts."``) and
    the request's charge and millicores (``mb`` and ``cpu_m``: parameters or columns)."""
    return {
        Term.ADMITTABLE_MB: f"{host}memory_mb_admittable",
        Term.MEMORY_TOTAL_MB: f"{host}memory_mb_total",
        Term.PENDING_MB: f"{host}reserved_mb",
        Term.CHARGE_MB: mb,
        Term.CPU_TOTAL: f"{host}cpu_total",
        Term.CPU_USED: f"{host}cpu_used",
        Term.PENDING_CPU: f"({host}reserved_cpu_m / 1000.0)",
        Term.REQUEST_CPU: f"({cpu_m} / 1000.0)",
    }


def _bound(bound: Bound, t: dict[Term, str], policy: AdmissionPolicy) -> str:
    need = " + ".join(t[x] for x in bound.need)
    room = t[bound.room]
    if bound.overcommitted:
        room = f"{room} * {policy.cpu_overcommit!r}"
    return f"{need} <= {room}"


def fit_condition(
    host: str = "", mb: str = ":mb", cpu_m: str = ":cpu", policy: AdmissionPolicy = DEFAULT_POLICY
) -> str:
    """``corral.core.admission.host_fits`` of a ready host, in SQL, on the row's reserved totals."""
    t = terms(host, mb, cpu_m)
    bounds = " AND ".join(f"({_bound(b, t, policy)})" for b in FIT_RULE)
    return f"{host}state = '{TAKES_STATE.value}' AND {bounds}"


def image_pattern(image: str | None) -> str | None:
    """What ``room_order``'s ``img`` parameter binds: a LIKE pattern finding the digest in a host's
    ``images`` (a JSON list; a digest holds no LIKE wildcard), or NULL (no image: no host matches)."""
    return None if image is None else f'%"{image}"%'


def room_order(
    scorer: Scorer = Scorer(), host: str = "", mb: str = ":mb", cpu_m: str = ":cpu", img: str = ":img"
) -> str:
    """``corral.core.scoring.Scorer.score`` of a spreading scorer, best first, as an ORDER BY term
    (``img``: the request's :func:`image_pattern`)."""
    if scorer.strategy is not Strategy.SPREAD:
        raise ValueError("the store ranks candidates for spreading only")
    t = terms(host, mb, cpu_m)
    parts = []
    for bound, weight in scorer.weighted():
        left = " - ".join([f"CAST({t[bound.room]} AS {DOUBLE})", *(t[x] for x in bound.need)])
        total = t[bound.total]
        parts.append(f"{weight!r} * (({left}) / CASE WHEN {total} <> 0 THEN {total} ELSE 1 END)")
    bonus = (
        f"CASE WHEN {host}stream_restore THEN {scorer.weights.stream_restore!r} ELSE 0 END"
        f" + CASE WHEN {host}images LIKE {img} THEN {scorer.weights.image!r} ELSE 0 END"
    )
    return f"({' + '.join(parts)} + {bonus}) DESC"


def by_tie_rank(salt: str, host_ids: Sequence[str]) -> list[str]:
    """``host_ids`` in the core's tie-break order for the request salted ``salt``: the store breaks a
    tie by a host's position in this list."""
    return sorted(set(host_ids), key=lambda h: (tie_rank(salt, h), h))
