from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.core import (
    AdmissionMode,
    AdmissionPolicy,
    CreateRequest,
    Oversize,
    PressureGate,
    SandboxUsage,
    admittable_mb,
    charge_mb,
    fits,
    oversize,
    reserve_mb,
)

from .conftest import make_host

GiB = 1024
CM = AdmissionMode.COMMITTED
WS = AdmissionMode.WORKING_SET


def admit_until_refused(mode: AdmissionMode, *, resident_mb: int | None, memory_mb: int = 4 * GiB) -> int:
    """Admit identical guests on one 32 GiB host, each measured at ``resident_mb`` once started."""
    live: list[SandboxUsage] = []
    req = CreateRequest(memory_mb=memory_mb)
    while fits(admittable_mb(32 * GiB, live, mode), 0, req, mode):
        live.append(SandboxUsage(memory_mb=memory_mb, resident_mb=resident_mb))
        assert len(live) < 10_000
    return len(live)


def test_reserve_is_max_of_floor_and_fraction() -> None:
    assert reserve_mb(4 * GiB) == 1024
    assert reserve_mb(1 * GiB) == 512
    # never charged more than the sandbox may ever use
    assert reserve_mb(256) == 256


def test_committed_fits_seven_4gib_guests_on_32gib() -> None:
    assert admit_until_refused(CM, resident_mb=300) == 7


def test_working_set_admits_at_least_5x_more_idle_guests_than_committed() -> None:
    committed = admit_until_refused(CM, resident_mb=300)
    working_set = admit_until_refused(WS, resident_mb=300)
    assert working_set >= 5 * committed
    # and every admitted guest really fits in physical memory at its working set
    assert working_set * 300 <= 32 * GiB


def test_unmeasured_sandboxes_are_charged_the_reserve_not_zero() -> None:
    # a burst of creates that have touched nothing yet must not all be admitted against free memory
    assert admit_until_refused(WS, resident_mb=None) == (32 * GiB - 2048) // 1024


def test_stateful_is_charged_in_full_in_both_modes() -> None:
    pg = SandboxUsage(memory_mb=8 * GiB, resident_mb=100, stateful=True)
    assert admittable_mb(32 * GiB, [pg], WS) == admittable_mb(32 * GiB, [pg], CM) == 32 * GiB - 2048 - 8 * GiB
    big = CreateRequest(memory_mb=31 * GiB, stateful=True)
    assert not fits(32 * GiB - 2048, 0, big, WS)
    assert fits(32 * GiB - 2048, 0, CreateRequest(memory_mb=31 * GiB), WS)


def test_pending_is_subtracted() -> None:
    req = CreateRequest(memory_mb=4 * GiB)
    assert fits(1024, 0, req, WS)
    assert not fits(1024, 1, req, WS)


@given(
    st.lists(
        st.tuples(st.integers(1, 16 * GiB), st.one_of(st.none(), st.integers(0, 16 * GiB)), st.booleans()),
        max_size=40,
    )
)
def test_working_set_never_charges_more_than_committed(
    rows: list[tuple[int, int | None, bool]],
) -> None:
    live = [SandboxUsage(m, min(r, m) if r is not None else None, s) for m, r, s in rows]
    assert admittable_mb(64 * GiB, live, WS) >= admittable_mb(64 * GiB, live, CM)
    for u in live:
        assert 0 <= charge_mb(u.memory_mb, u.stateful, WS, u.resident_mb) <= u.memory_mb


def test_policy_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        AdmissionPolicy(reserve_frac=0)
    with pytest.raises(ValueError):
        CreateRequest(memory_mb=0)


def test_pressure_gate_has_hysteresis() -> None:
    gate = PressureGate(close_at=10.0, open_at=5.0)
    assert gate.observe(9.9)
    assert not gate.observe(10.0)
    # hovering between the thresholds keeps it closed: no chatter
    for p in [9.0, 10.5, 6.0, 9.99, 5.0]:
        assert not gate.observe(p)
    assert gate.observe(4.9)
    assert gate.transitions == 2
    with pytest.raises(ValueError):
        PressureGate(close_at=5.0, open_at=5.0)


@given(st.lists(st.floats(0, 100, allow_nan=False), max_size=200))
def test_pressure_gate_flips_only_across_the_band(readings: list[float]) -> None:
    gate = PressureGate(close_at=60.0, open_at=40.0)
    for p in readings:
        was = gate.is_open
        now_open = gate.observe(p)
        if was and not now_open:
            assert p >= 60.0
        if not was and now_open:
            assert p < 40.0


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["put", "remove"]),
            st.sampled_from(["a", "b", "c", "d"]),
            st.integers(1, 8192),
            st.one_of(st.none(), st.integers(0, 8192)),
            st.booleans(),
        ),
        max_size=60,
    ),
    st.sampled_from([CM, WS]),
)
def test_the_admission_book_is_the_same_rule_kept_incrementally(
    ops: list[tuple[str, str, int, int | None, bool]], mode: AdmissionMode
) -> None:
    from corral.core.admission import AdmissionBook

    book = AdmissionBook(64 * GiB, mode)
    model: dict[str, SandboxUsage] = {}
    for op, key, mem, resident, stateful in ops:
        if op == "put":
            model[key] = SandboxUsage(mem, resident, stateful)
            book.put(key, model[key])
        else:
            model.pop(key, None)
            book.remove(key)
        assert book.admittable() == admittable_mb(64 * GiB, model.values(), mode)
        assert len(book) == len(model)


def test_oversize_is_measured_against_the_largest_host_of_the_placeable_roles() -> None:
    workers = [make_host("a", cpu_total=4.0, total=8 * GiB), make_host("b", cpu_total=8.0, total=16 * GiB)]
    big_other = make_host("c", cpu_total=64.0, total=256 * GiB, role="builder")
    unreported = make_host("d", cpu_total=0.0, total=0)
    roles = {"worker"}
    hosts = [*workers, big_other, unreported]
    # CPU is overcommitted per host, never per sandbox: the largest host's CPUs are the bound.
    assert oversize(hosts, CreateRequest(memory_mb=512, cpu=8.0), roles) is None
    assert oversize(hosts, CreateRequest(memory_mb=512, cpu=8.001), roles) == Oversize("cpus", 8.0)
    assert oversize(hosts, CreateRequest(memory_mb=16 * GiB, cpu=1.0), roles) is None
    assert oversize(hosts, CreateRequest(memory_mb=16 * GiB + 1, cpu=1.0), roles) == Oversize(
        "memory_mb", 16 * GiB
    )
    assert oversize(hosts, CreateRequest(memory_mb=512, cpu=32.0), {"worker", "builder"}) is None
    # Nothing known of any host's size: nothing is known to be too large.
    assert oversize([unreported], CreateRequest(memory_mb=1 << 30, cpu=1000.0), roles) is None
    assert oversize([], CreateRequest(memory_mb=512, cpu=1000.0), roles) is None


def test_a_fresh_serve_on_a_24_gib_machine_admits_the_readmes_burst_unmeasured() -> None:
    """`corral serve` with its defaults on 24 GiB: twelve process hosts of 2,048 MiB (headroom 256).
    The README's 50 default creates (512 MiB each) must fit before any of them is measured; at the
    policy's own 512 MiB floor only 36 do."""
    from corral.api.cli import PROCESS_RESERVE_FLOOR_MB
    from corral.core import reserve_mb

    def unmeasured_per_fleet(floor: int) -> int:
        policy = AdmissionPolicy(headroom_mb=2048 // 8, reserve_floor_mb=floor)
        return 12 * ((2048 - policy.headroom_mb) // reserve_mb(512, policy))

    assert unmeasured_per_fleet(PROCESS_RESERVE_FLOOR_MB) >= 50
    assert unmeasured_per_fleet(AdmissionPolicy().reserve_floor_mb) < 50
