"""Fixtures for the agent's tests: a manual clock, a sim runtime over a state that outlives it, and an
agent factory."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest
from agent_doubles import POLICY

from corral.agent import Agent, AgentConfig
from corral.core import ManualClock
from corral.runtime.sim import SimRuntime, SimState

CONFIG_FIELDS = {f.name for f in dataclasses.fields(AgentConfig)}


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
        """An agent; ``overrides`` name fields of its :class:`AgentConfig` or its collaborators."""
        settings: dict[str, Any] = {
            "id": "host-1",
            "memory_mb_total": 16_384,
            "cpu_total": 8.0,
            "policy": POLICY,
            "address": "http://127.0.0.1:7070",
        }
        wired: dict[str, Any] = {
            "runtime": runtime,
            "clock": clock,
            # A pressure signal that never closes the gate unless a test says otherwise.
            "pressure": lambda: 0.0,
        }
        for name, value in overrides.items():
            (settings if name in CONFIG_FIELDS else wired)[name] = value
        return Agent(AgentConfig(**settings), **wired)

    return make
