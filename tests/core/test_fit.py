"""The fit rule as declared (``corral.core.fit``) is what the core's filters and score evaluate, and
ties among equally good hosts go by ``tie_rank``, the rule the store follows too."""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from corral.core import (
    DEFAULT_POLICY,
    FIT_RULE,
    CreateRequest,
    FullScan,
    HostView,
    Pending,
    Placer,
    Scorer,
    ScoreWeights,
    cpu_fits,
    fit_terms,
    host_fits,
    memory_fits,
    tie_rank,
)
from corral.core.fit import CPU, MEMORY
from corral.core.selection import tie_salt

from .conftest import make_host

eighths = st.integers(min_value=0, max_value=160).map(lambda n: n / 8)


Situation = tuple[HostView, Pending, CreateRequest]


@st.composite
def situations(draw: st.DrawFn, most_mb: int = 8192, totals: bool = False) -> Situation:
    """A host (its memory total drawn too with ``totals``), what is pending on it, and a request."""
    host = make_host(
        total=draw(st.integers(min_value=0, max_value=most_mb)) if totals else 32768,
        admittable=draw(st.integers(min_value=-1024, max_value=most_mb)),
        cpu_total=draw(eighths),
        cpu_used=draw(eighths),
    )
    pending = Pending(draw(st.integers(min_value=0, max_value=8192)), draw(eighths))
    req = CreateRequest(
        memory_mb=draw(st.integers(min_value=1, max_value=8192)),
        cpu=draw(eighths),
        stateful=draw(st.booleans()),
    )
    return host, pending, req


@given(situations())
def test_the_filters_are_the_declared_bounds(situation: Situation) -> None:
    host, pending, req = situation
    values = fit_terms(host, pending, req)
    charge = values[MEMORY.need[-1]]
    # the declaration, written out by hand once, here
    assert memory_fits(host, pending, req) == (host.memory_mb_admittable - pending.memory_mb >= charge)
    assert cpu_fits(host, pending, req) == (
        host.cpu_used + pending.cpu + req.cpu <= host.cpu_total * DEFAULT_POLICY.cpu_overcommit
    )
    assert host_fits(host, pending, req) == all(
        b.holds(values, DEFAULT_POLICY.cpu_overcommit) for b in FIT_RULE
    )
    assert FIT_RULE == (MEMORY, CPU)


def test_headroom_is_what_each_bound_leaves_over_the_total() -> None:
    host = make_host(total=10_000, admittable=6_000, cpu_total=8.0, cpu_used=2.0)
    req = CreateRequest(memory_mb=4096, cpu=1.0)  # working-set: charged its 1024 MiB reserve
    got = Scorer().headroom(host, Pending(1000, 1.0), req)
    assert got == 0.7 * ((6_000 - 1000 - 1024) / 10_000) + 0.3 * ((8.0 - 2.0 - 1.0 - 1.0) / 8.0)


@given(situations(most_mb=1 << 20, totals=True), st.floats(min_value=0, max_value=1))
def test_the_compiled_headroom_is_the_declared_bounds_left_over_their_totals(
    situation: Situation, memory_weight: float
) -> None:
    host, pending, req = situation
    scorer = Scorer(weights=ScoreWeights(memory=memory_weight, cpu=1 - memory_weight))
    values = fit_terms(host, pending, req)
    # the declaration read term by term, added in the order the weights list the bounds
    expected = 0.0
    for bound, weight in scorer.weighted():
        expected = expected + weight * (bound.left(values) / (values[bound.total] or 1))
    assert scorer.headroom(host, pending, req) == expected


def test_tied_hosts_go_by_tie_rank_under_a_salt_from_the_rng() -> None:
    hosts = [make_host(f"t{i}") for i in range(5)]
    won: Counter[str] = Counter()
    for seed in range(80):
        salt = tie_salt(random.Random(seed))  # FullScan draws nothing before it needs the salt
        d = Placer(selector=FullScan()).place(
            hosts, CreateRequest(memory_mb=512), now=0.0, rng=random.Random(seed)
        )
        assert d.host.id == min((h.id for h in hosts), key=lambda h: tie_rank(salt, h))
        won[d.host.id] += 1
    assert set(won) == {h.id for h in hosts}, won


def test_tie_rank_is_deterministic_per_salt_and_varies_across_salts() -> None:
    assert tie_rank("a", "h1") == tie_rank("a", "h1")
    assert -(2**63) <= tie_rank("a", "h1") < 2**63
    assert len({tie_rank(f"s{i}", "h1") for i in range(50)}) == 50
