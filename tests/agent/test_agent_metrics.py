"""One collector serves every in-process agent, labelled by agent."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

from corral.agent import Agent, AgentCollector, StartSandbox


async def test_one_collector_many_agents(make_agent: Callable[..., Agent]) -> None:
    fleet = [make_agent(id="h1"), make_agent(id="h2")]
    registry = CollectorRegistry()
    registry.register(AgentCollector(lambda: fleet))
    await fleet[0].start(StartSandbox(id="a", memory_mb=512))
    text = generate_latest(registry).decode()
    assert 'corral_agent_sandboxes{agent="h1"} 1.0' in text
    assert 'corral_agent_sandboxes{agent="h2"} 0.0' in text
    fleet.append(make_agent(id="h3"))  # read at scrape time: a new agent shows up without re-registering
    assert 'corral_agent_sandboxes{agent="h3"} 0.0' in generate_latest(registry).decode()
