"""A command's outcome has one shape from the runtime that ran it to the SDK that returns it."""

from __future__ import annotations

import typing

from corral.agent.agent import Agent
from corral.agent.client import HttpAgentClient
from corral.api.routes import exec_in_sandbox
from corral.client import ExecResult as SdkExecResult
from corral.control.sandboxes import Sandboxes
from corral.exec_result import ExecResult
from corral.runtime.base import Runtime


def test_every_layer_returns_the_one_exec_result() -> None:
    assert SdkExecResult is ExecResult
    for verb in (Runtime.exec, Agent.exec, HttpAgentClient.exec, Sandboxes.exec, exec_in_sandbox):
        assert typing.get_type_hints(verb)["return"] is ExecResult, verb.__qualname__


def test_a_newer_servers_extra_field_is_ignored_and_the_flags_default_off() -> None:
    r = ExecResult.model_validate({"exit_code": 0, "stdout": "hi\n", "cpu_ms": 3})
    assert r.ok and r.stdout == "hi\n" and not r.truncated and not r.timed_out
    cut = ExecResult.model_validate({"exit_code": 137, "truncated": True, "timed_out": True})
    assert not cut.ok and cut.truncated and cut.timed_out
