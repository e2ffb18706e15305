"""Fixtures for the agent's tests: a manual clock, a sim runtime over a state that outlives it, and an
agent factory."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from agent_doubles import POLICY

from corral.agent import Agent
from corral.core import ManualClock
from corral.runtime.sim import SimRuntime, SimState


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_000.0)


@pytest.fixture
def sim_state() -> SimState:
    return SimState()


@pytest.fixture
def runtime(clock: ManualClock, sim_state: SimState) -> SimRuntime:
    return SimRuntime(clock, random.Random(7), state=sim_state)


@pytest.fixture
def make_agent(clock: ManualClock, runtime: SimRuntime) -> Callable[..., Agent]:
    def make(**overrides: Any) -> Agent:
        kwargs: dict[str, Any] = {
            "id": "host-1",
            "runtime": runtime,
            "memory_mb_total": 16_384,
            "cpu_total": 8.0,
            "policy": POLICY,
            "clock": clock,
            "address": "http://127.0.0.1:7070",
            # A pressure signal that never closes the gate unless a test says otherwise.
            "pressure": lambda: 0.0,
        }
        kwargs.update(overrides)
        return Agent(**kwargs)

    return make
