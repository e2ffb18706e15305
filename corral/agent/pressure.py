"""Where the pressure gate's signal comes from. The gate itself is the core's
:class:`corral.core.pressure.PressureGate`; this module only reads the host.

A signal is a callable returning a number, or None when it cannot be read right now (a None never moves
the gate). Each signal comes with the thresholds that make sense on its scale.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from corral.core.pressure import PressureGate

PressureSource = Callable[[], float | None]

PSI_MEMORY = Path("/proc/pressure/memory")
MEMINFO = Path("/proc/meminfo")


@dataclass(frozen=True, slots=True)
class PressureSignal:
    """A pressure reading and the hysteresis band it is judged by."""

    name: str
    read: PressureSource
    close_at: float
    open_at: float

    def gate(self) -> PressureGate:
        return PressureGate(close_at=self.close_at, open_at=self.open_at)


def read_psi_some_avg10(path: Path = PSI_MEMORY) -> float | None:
    """``some avg10`` of a PSI file: the share of the last 10 s in which some task stalled on memory (%)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            for part in line.split()[1:]:
                key, _, value = part.partition("=")
                if key == "avg10":
                    try:
                        return float(value)
                    except ValueError:
                        return None
    return None


def read_meminfo_used_ratio(path: Path = MEMINFO) -> float | None:
    """1 - MemAvailable / MemTotal: the host's memory in use, as a fraction."""
    try:
        text = path.read_text()
    except OSError:
        return None
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[key] = int(parts[0])
    total, available = fields.get("MemTotal"), fields.get("MemAvailable")
    if not total or available is None:
        return None
    return 1.0 - available / total


def psi_signal(path: Path = PSI_MEMORY, close_at: float = 10.0, open_at: float = 2.0) -> PressureSignal:
    # Stalls lead the collapse: 10% of the last ten seconds stalled on memory is well before the OOM
    # killer, and 2% is quiet enough to take work again.
    return PressureSignal("psi_memory_some_avg10", lambda: read_psi_some_avg10(path), close_at, open_at)


def usage_ratio_signal(
    read: PressureSource, name: str = "memory_used_ratio", close_at: float = 0.95, open_at: float = 0.90
) -> PressureSignal:
    return PressureSignal(name, read, close_at, open_at)


def sim_signal(read: PressureSource, *thresholds: float) -> PressureSignal:
    """A ``sim`` host's memory in use, from its runtime's model of physical memory; ``thresholds``:
    close at, open at (those of :func:`usage_ratio_signal` unless given)."""
    return usage_ratio_signal(read, "sim_memory_used_ratio", *thresholds)


def host_signal(psi_path: Path = PSI_MEMORY, meminfo_path: Path = MEMINFO) -> PressureSignal:
    """PSI where the kernel has it, the host's used-memory ratio where it does not."""
    if read_psi_some_avg10(psi_path) is not None:
        return psi_signal(psi_path)
    return usage_ratio_signal(lambda: read_meminfo_used_ratio(meminfo_path), "meminfo_used_ratio")
