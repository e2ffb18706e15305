from __future__ import annotations

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.core import (
    AdmissionMode,
    ConfigError,
    CreateRequest,
    FullScan,
    HostState,
    HostView,
    Jitter,
    Ledger,
    ManualClock,
    Naive,
    NoCapacity,
    NoHealthyHosts,
    Placer,
    PowerOfK,
    Reason,
    Scheduler,
    Scorer,
    Strategy,
    Timeouts,
    first_failure,
)
from corral.core.filters import FilterContext

from .conftest import make_host

SELECTORS = [PowerOfK(2), PowerOfK(3), FullScan(), Naive(), Jitter()]
REQ = CreateRequest(memory_mb=2048, cpu=1.0)


def fleet(n: int = 12, *, step_mb: int = 300) -> list[HostView]:
    # free memory a few hundred MB apart, as in a real fleet: scores strictly order
    return [make_host(f"h{i:02d}", admittable=20000 + i * step_mb) for i in range(n)]


def test_naive_over_a_frozen_view_without_ledger_sends_every_decision_to_one_host() -> None:
    placer = Placer(selector=Naive())
    hosts = fleet()
    rng = random.Random(1)
    landed = Counter(placer.place(hosts, REQ, now=0.0, rng=rng).host.id for _ in range(50))
    assert landed == {"h11": 50}  # every decision on the top host: the pile-up, reproduced


def test_power_of_two_without_ledger_spreads_a_frozen_burst() -> None:
    placer = Placer(selector=PowerOfK(2))
    rng = random.Random(1)
    landed = Counter(placer.place(fleet(), REQ, now=0.0, rng=rng).host.id for _ in range(50))
    assert len(landed) >= 6
    assert max(landed.values()) < 50


def test_ledger_turns_naive_into_a_walk_of_the_fleet() -> None:
    clock = ManualClock()
    sched = Scheduler(Placer(selector=Naive()), Ledger(clock), random.Random(1))
    hosts = [make_host(f"h{i}", admittable=20000) for i in range(12)]
    landed = Counter(sched.schedule(hosts, REQ, now=0.0)[0].host.id for _ in range(48))
    assert set(landed.values()) == {4}


@pytest.mark.parametrize("selector", SELECTORS, ids=lambda s: s.name)
@given(
    admittable=st.lists(st.integers(-4096, 12000), min_size=1, max_size=20),
    mem=st.sampled_from([256, 512, 1024, 4096]),
    stateful=st.booleans(),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_decisions_against_a_frozen_view_with_a_ledger_never_overfill(
    selector: object, admittable: list[int], mem: int, stateful: bool, seed: int
) -> None:
    clock = ManualClock()
    ledger = Ledger(clock)
    sched = Scheduler(Placer(selector=selector), ledger, random.Random(seed))  # type: ignore[arg-type]
    hosts = [make_host(f"h{i}", admittable=a, cpu_total=1000) for i, a in enumerate(admittable)]
    req = CreateRequest(memory_mb=mem, stateful=stateful)
    placed = 0
    for _ in range(200):
        try:
            sched.schedule(hosts, req, now=0.0)
        except NoCapacity:
            break
        placed += 1
    for h in hosts:
        assert ledger.pending(h.id).memory_mb <= max(0, h.memory_mb_admittable)
    # and it refused only when nothing fitted any more
    assert all(
        h.memory_mb_admittable - ledger.pending(h.id).memory_mb < placed_charge(req) for h in hosts
    ) or (placed == 200)


def placed_charge(req: CreateRequest) -> int:
    from corral.core import request_charge_mb

    return request_charge_mb(req, AdmissionMode.WORKING_SET)


host_strategy = st.builds(
    lambda i, age, state, admittable, template, runtime, gpu: make_host(
        f"h{i}",
        now=-age,
        admittable=admittable,
        state=state,
        templates=template,
        runtime=runtime,
        gpu=gpu,
    ),
    st.integers(0, 10_000),
    st.sampled_from([0.0, 5.0, 29.0, 31.0, 300.0]),
    st.sampled_from([HostState.READY, HostState.DRAINING]),
    st.integers(-1000, 8000),
    st.sampled_from([None, frozenset({"py"}), frozenset({"node"})]),
    st.sampled_from(["sim", "process"]),
    st.sampled_from([None, "a100"]),
)


@pytest.mark.parametrize("selector", SELECTORS, ids=lambda s: s.name)
@given(
    hosts=st.lists(host_strategy, min_size=0, max_size=30, unique_by=lambda h: h.id),
    template=st.sampled_from([None, "py"]),
    runtime=st.sampled_from([None, "process"]),
    gpu=st.sampled_from([None, "a100"]),
    seed=st.integers(0, 1000),
)
@settings(max_examples=60, deadline=None)
def test_no_stale_draining_or_infeasible_host_is_ever_chosen(
    selector: object,
    hosts: list[HostView],
    template: str | None,
    runtime: str | None,
    gpu: str | None,
    seed: int,
) -> None:
    placer = Placer(selector=selector, stale_after_s=30.0)  # type: ignore[arg-type]
    req = CreateRequest(memory_mb=1024, template=template, runtime=runtime, gpu=gpu)
    ctx = FilterContext(now=0.0, stale_after_s=30.0)
    feasible = {h.id for h in hosts if first_failure(h, req, ctx) is None}
    try:
        d = placer.place(hosts, req, now=0.0, rng=random.Random(seed))
    except NoHealthyHosts as e:
        assert all(0.0 - h.heartbeat_at > 30.0 for h in hosts)
        assert e.checked == len(hosts)
        return
    except NoCapacity as e:
        assert not feasible
        assert e.checked == len(hosts) and sum(e.reasons.values()) == len(hosts)
        return
    h = d.host
    assert h.id in feasible
    assert 0.0 - h.heartbeat_at <= 30.0 and h.state is HostState.READY


def test_refusals_say_what_was_checked() -> None:
    hosts = [
        make_host("a", now=-100),
        make_host("b", state=HostState.DRAINING),
        make_host("c", admittable=100),
        make_host("d", admittable=100),
    ]
    with pytest.raises(NoCapacity) as err:
        Placer().place(hosts, REQ, now=0.0, rng=random.Random(0))
    assert err.value.reasons == {Reason.STALE: 1, Reason.DRAINING: 1, Reason.FIT: 2}
    assert err.value.checked == 4
    assert "4 hosts checked" in str(err.value) and "2 does_not_fit" in str(err.value)
    with pytest.raises(NoHealthyHosts):
        Placer().place(hosts[:1], REQ, now=0.0, rng=random.Random(0))
    with pytest.raises(NoHealthyHosts):
        Placer().place([], REQ, now=0.0, rng=random.Random(0))
    assert NoCapacity({}, 0).code != NoHealthyHosts({}, 0).code
    assert NoCapacity({}, 0).retryable and NoHealthyHosts({}, 0).retryable


def test_power_of_k_falls_back_to_a_full_scan_when_most_of_the_fleet_is_full() -> None:
    hosts = [make_host(f"h{i}", admittable=10) for i in range(1000)]
    hosts[737] = make_host("h737", admittable=20000)
    rng = random.Random(3)
    for _ in range(20):
        assert Placer(selector=PowerOfK(2)).place(hosts, REQ, now=0.0, rng=rng).host.id == "h737"


def test_excluded_hosts_are_skipped() -> None:
    hosts = fleet(3)
    d = Placer(selector=FullScan()).place(
        hosts, REQ, now=0.0, rng=random.Random(0), exclude=frozenset({"h02"})
    )
    assert d.host.id == "h01"


def test_pack_prefers_the_fullest_host_that_fits() -> None:
    d = Placer(selector=FullScan(), scorer=Scorer(strategy=Strategy.PACK)).place(
        fleet(), REQ, now=0.0, rng=random.Random(0)
    )
    assert d.host.id == "h00"


def test_stream_restore_is_a_soft_preference() -> None:
    hosts = [make_host("plain", admittable=20300), make_host("stream", admittable=20000, stream_restore=True)]
    assert Placer(selector=FullScan()).place(hosts, REQ, now=0.0, rng=random.Random(0)).host.id == "stream"
    # a soft preference never overrides a hard rule
    hosts[1] = make_host("stream", admittable=1000, stream_restore=True)
    assert Placer(selector=FullScan()).place(hosts, REQ, now=0.0, rng=random.Random(0)).host.id == "plain"


def test_decision_reports_view_age() -> None:
    hosts = [make_host("a", now=-7.0)]
    assert Placer().place(hosts, REQ, now=0.0, rng=random.Random(0)).view_age_s == 7.0


def test_committed_host_charges_the_full_request() -> None:
    hosts = [make_host("c", admittable=3000, mode=AdmissionMode.COMMITTED)]
    d = Placer().place(hosts, CreateRequest(memory_mb=2048), now=0.0, rng=random.Random(0))
    assert d.charge_mb == 2048
    with pytest.raises(NoCapacity):
        Placer().place(hosts, CreateRequest(memory_mb=4096), now=0.0, rng=random.Random(0))


def test_timeouts_orderings_are_enforced() -> None:
    Timeouts()
    with pytest.raises(ConfigError):
        Timeouts(heartbeat_interval_s=10, stale_after_s=5)
    with pytest.raises(ConfigError):
        Timeouts(stale_after_s=30, dead_after_s=30)
    with pytest.raises(ConfigError):
        Timeouts(bind_timeout_s=60, reservation_ttl_s=30)


def test_candidates_lead_with_the_chosen_host_even_among_many_ties() -> None:
    hosts = [make_host(f"h{i:02d}", admittable=20000) for i in range(40)]
    for seed in range(30):
        d = Placer(selector=FullScan()).place(hosts, REQ, now=0.0, rng=random.Random(seed))
        assert d.candidates[0] is d.host and len(d.candidates) == 8
        assert len({h.id for h in d.candidates}) == 8


def test_a_refusal_says_whether_memory_or_cpu_ran_out() -> None:
    hosts = [make_host("mem", admittable=100), make_host("cpu", cpu_total=1.0, cpu_used=4.0)]
    with pytest.raises(NoCapacity) as err:
        Placer().place(hosts, REQ, now=0.0, rng=random.Random(0))
    assert err.value.reasons == {Reason.FIT: 1, Reason.CPU: 1}
