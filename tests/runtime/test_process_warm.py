"""Warm sandboxes on the process runtime: the agent fills its target with real sandboxes, a claim hands
one over at once, and the claimed sandbox runs a command with the claim's environment right away."""

from __future__ import annotations

import asyncio
from typing import Any

from corral.agent.agent import Agent
from corral.agent.config import AgentConfig
from corral.agent.protocol import ClaimWarm, ExecRequest, WarmTarget


async def test_a_claimed_process_sandbox_runs_a_command_at_once(make_process_runtime: Any) -> None:
    runtime = make_process_runtime()
    agent = Agent(AgentConfig("proc-host", 8192, 4.0), runtime)
    agent.set_warm_targets([WarmTarget(template="sh", target=2, memory_mb=128)])
    for _ in range(400):
        agent.replenish()
        await asyncio.sleep(0.01)
        if agent.warm.ready_count("sh") == 2:
            break
    assert agent.warm.ready_count("sh") == 2
    assert len(await runtime.list()) == 2  # real sandboxes, and no more than the target
    info = agent.claim("sh", ClaimWarm(env={"GREETING": "hello from a warm sandbox"}))
    out = await agent.exec(info.id, ExecRequest(command=["/bin/sh", "-c", "echo $GREETING"], timeout_s=10))
    assert out.exit_code == 0 and out.stdout == "hello from a warm sandbox\n"
    # The other one was never claimed: the environment is the claim's, not the pool's.
    other = next(agent.warm.ready_ids())
    out = await agent.exec(
        other, ExecRequest(command=["/bin/sh", "-c", "echo ${GREETING:-none}"], timeout_s=10)
    )
    assert out.stdout == "none\n"
    agent.set_warm_targets([])
    agent.replenish()
    for _ in range(100):
        await asyncio.sleep(0.01)
        if agent.warm.ready_count("sh") == 0 and len(await runtime.list()) == 1:
            break
    assert [h.id for h in await runtime.list()] == [info.id]  # a pool's end leaves claimed ones
    await agent.stop(info.id)
