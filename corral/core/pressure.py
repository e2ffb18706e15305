"""Memory-pressure gate with hysteresis: closes at ``close_at``, reopens only below ``open_at``.

Driven by a pressure signal that leads the collapse (PSI avg10, or a usage ratio), so intake stops
before the kernel's OOM killer has to choose; the gap between the thresholds stops it chattering.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PressureGate:
    close_at: float
    open_at: float
    is_open: bool = True
    transitions: int = field(default=0)

    def __post_init__(self) -> None:
        if not self.open_at < self.close_at:
            raise ValueError("open_at must be below close_at (hysteresis)")

    def observe(self, pressure: float) -> bool:
        """Feed one reading; returns whether intake is open afterwards."""
        if self.is_open and pressure >= self.close_at:
            self.is_open = False
            self.transitions += 1
        elif not self.is_open and pressure < self.open_at:
            self.is_open = True
            self.transitions += 1
        return self.is_open
