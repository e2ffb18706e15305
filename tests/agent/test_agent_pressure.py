"""The pressure gate as the agent drives it: hysteresis, refusal code, and the host signals."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from corral.agent import Agent, AgentRefusal, PressureSignal, StartSandbox
from corral.agent.pressure import (
    host_signal,
    psi_signal,
    read_meminfo_used_ratio,
    read_psi_some_avg10,
)
from corral.codes import ErrorCode
from corral.core import ManualClock


class Dial:
    """A pressure reading the test turns by hand."""

    def __init__(self, value: float = 0.0) -> None:
        self.value: float | None = value

    def __call__(self) -> float | None:
        return self.value


async def test_gate_does_not_chatter_when_pressure_hovers_at_the_threshold(
    make_agent: Callable[..., Agent],
) -> None:
    dial = Dial(0.0)
    agent = make_agent(
        pressure=PressureSignal("psi", dial, close_at=10.0, open_at=5.0), memory_mb_total=1 << 20
    )
    outcomes: list[bool] = []
    for n, reading in enumerate([9.9, 10.1, 9.9, 10.0, 9.8, 10.2, 9.9, 6.0, 5.1, 9.9]):
        dial.value = reading
        try:
            await agent.start(StartSandbox(id=f"s{n}", memory_mb=512))
            outcomes.append(True)
        except AgentRefusal as exc:
            assert exc.code == ErrorCode.HOST_MEMORY_PRESSURE
            assert exc.retry_after_s and exc.details["close_at"] == 10.0
            outcomes.append(False)
    # Open until the first crossing, then shut for good while it hovers: one transition, no flapping.
    assert outcomes == [True] + [False] * 9
    assert agent.gate.transitions == 1
    assert not agent.capacity().intake_open

    # Only falling below open_at reopens, and a heartbeat's measurement is enough to notice.
    dial.value = 4.9
    await agent.measure()
    assert agent.gate.is_open and agent.gate.transitions == 2
    await agent.start(StartSandbox(id="after", memory_mb=512))


async def test_unreadable_signal_keeps_the_gate_where_it_was(make_agent: Callable[..., Agent]) -> None:
    dial = Dial(50.0)
    agent = make_agent(pressure=PressureSignal("psi", dial, close_at=10.0, open_at=5.0))
    with pytest.raises(AgentRefusal):
        await agent.start(StartSandbox(id="a", memory_mb=512))
    dial.value = None  # PSI vanished for a moment: no news is not good news
    with pytest.raises(AgentRefusal):
        await agent.start(StartSandbox(id="a", memory_mb=512))

    def broken() -> float:
        raise OSError("unreadable")

    agent2 = make_agent(pressure=PressureSignal("psi", broken, close_at=10.0, open_at=5.0))
    await agent2.start(StartSandbox(id="b", memory_mb=512))  # a broken reading never crashes a start


async def test_default_signal_is_the_sandboxes_measured_usage(
    make_agent: Callable[..., Agent], clock: ManualClock
) -> None:
    # A 4 GiB sim host whose sandboxes grow to about 300 MiB each: by the fourth, over 0.2 of the host.
    agent = make_agent(pressure=None, memory_mb_total=4096, pressure_gate=None)
    assert agent.signal.name == "sandbox_resident_ratio"
    for i in range(4):
        await agent.start(StartSandbox(id=f"s{i}", memory_mb=512))
    clock.advance(60)
    await agent.measure()
    assert agent.used_ratio() == pytest.approx(agent.memory_mb_used() / 4096)
    assert 0.1 < agent.used_ratio() < 0.95
    assert agent.gate.is_open


def test_psi_parsing(tmp_path: Path) -> None:
    psi = tmp_path / "memory"
    psi.write_text(
        "some avg10=12.34 avg60=1.00 avg300=0.10 total=123\nfull avg10=3.00 avg60=0.00 avg300=0.00 total=4\n"
    )
    assert read_psi_some_avg10(psi) == 12.34
    assert psi_signal(psi).read() == 12.34
    assert host_signal(psi_path=psi).name == "psi_memory_some_avg10"
    psi.write_text("garbage\n")
    assert read_psi_some_avg10(psi) is None
    assert read_psi_some_avg10(tmp_path / "absent") is None


def test_meminfo_fallback_where_psi_is_absent(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       1000 kB\nMemFree:         100 kB\nMemAvailable:    250 kB\n")
    assert read_meminfo_used_ratio(meminfo) == pytest.approx(0.75)
    signal = host_signal(psi_path=tmp_path / "no-psi", meminfo_path=meminfo)
    assert signal.name == "meminfo_used_ratio"
    assert signal.read() == pytest.approx(0.75)
    assert signal.close_at > signal.open_at
    meminfo.write_text("MemTotal: 0 kB\n")
    assert read_meminfo_used_ratio(meminfo) is None
