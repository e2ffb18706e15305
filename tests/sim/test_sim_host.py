import random

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.codes import ErrorCode
from corral.core import AdmissionMode, CreateRequest, TouchModel, admittable_mb, reserve_mb
from corral.sim.baselines.host import SimHost
from corral.sim.scenario import HostSpec


def make_host(**spec: object) -> SimHost:
    return SimHost("h0", HostSpec(**spec), TouchModel(), random.Random(7))  # type: ignore[arg-type]


REQ = CreateRequest(memory_mb=4096)


def test_an_unmeasured_sandbox_is_charged_its_reserve_until_it_settles() -> None:
    host = make_host(settle_s=30.0)
    host.admit(1, REQ, now=0.0)
    view = host.heartbeat(10.0)
    assert host.sandboxes[1].measured_mb is None
    assert view.memory_mb_admittable == 32768 - 2048 - reserve_mb(4096)
    view = host.heartbeat(40.0)
    measured = host.sandboxes[1].measured_mb
    assert measured is not None and measured < reserve_mb(4096)
    assert view.memory_mb_admittable == 32768 - 2048 - measured


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(["admit", "remove", "measure"]), st.integers(0, 9)), max_size=40),
    st.sampled_from(list(AdmissionMode)),
)
def test_the_gate_number_always_equals_the_core_arithmetic(
    ops: list[tuple[str, int]], mode: AdmissionMode
) -> None:
    host = make_host(mode=mode, settle_s=5.0)
    now = 0.0
    for op, k in ops:
        now += 3.0
        if op == "admit" and k not in host.sandboxes:
            host.admit(k, CreateRequest(memory_mb=1024 * (1 + k % 4), stateful=k == 9), now)
        elif op == "remove":
            host.remove(k)
        elif op == "measure":
            host.measure(now)
        usages = [s.usage() for s in host.sandboxes.values()]
        assert host.admittable == admittable_mb(32768, usages, mode)


def test_the_starts_limiter_refuses_then_reopens_when_a_start_completes() -> None:
    host = make_host(starts_limit=2)
    a = host.admit(1, REQ, 0.0)
    host.admit(2, REQ, 0.0)
    assert host.refusal(REQ) == ErrorCode.HOST_STARTS_SATURATED
    host.started(a)
    assert host.refusal(REQ) is None


def test_the_gate_refuses_what_does_not_fit_and_no_gate_admits_anything() -> None:
    gated = make_host(mode=AdmissionMode.COMMITTED)
    for i in range(7):
        assert gated.refusal(REQ) is None
        gated.admit(i, REQ, 0.0)
    assert gated.refusal(REQ) == ErrorCode.HOST_DOES_NOT_FIT
    open_host = make_host(mode=AdmissionMode.COMMITTED, gate=False)
    for i in range(20):
        open_host.admit(i, REQ, 0.0)
    assert open_host.refusal(REQ) is None


def test_exceeding_physical_memory_kills_the_largest_sandbox_and_counts_it() -> None:
    host = make_host(memory_mb=4096, gate=False)
    for i in range(3):
        host.preload(i, 2048, 1500 + i, 1.0, 0.0)
    killed = host.memory_tick(0.0)
    assert [s.id for s in killed] == [2]
    assert host.oom_events == 1 and set(host.sandboxes) == {0, 1}


def test_the_pressure_gate_closes_intake_with_hysteresis() -> None:
    host = make_host(memory_mb=10000, pressure=(0.9, 0.8))
    host.preload(1, 9500, 9500, 1.0, 0.0)
    host.memory_tick(0.0)
    assert host.refusal(CreateRequest(memory_mb=100)) == ErrorCode.HOST_MEMORY_PRESSURE
    host.remove(1)
    host.memory_tick(1.0)
    assert host.refusal(CreateRequest(memory_mb=100)) is None


def test_an_unreachable_host_refuses_as_unreachable() -> None:
    host = make_host()
    host.reachable = False
    assert host.refusal(REQ) == ErrorCode.HOST_UNREACHABLE
