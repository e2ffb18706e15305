"""Prometheus metrics of host agents, read from the agents at scrape time (no globals, base units).

One collector serves any number of agents (``corral serve`` runs several in one process), each series
labelled with its agent's id. Register it in whichever registry exposes ``/metrics``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from corral.agent.agent import Agent
from corral.agent.warm import CLAIM_BUCKETS_S

MIB = 1024 * 1024


class AgentCollector(Collector):
    def __init__(self, agents: Iterable[Agent] | Callable[[], Iterable[Agent]]) -> None:
        self._agents = agents

    def _current(self) -> list[Agent]:
        agents = self._agents() if callable(self._agents) else self._agents
        return list(agents)

    def collect(self) -> Iterator[Metric]:
        label = ["agent"]
        total = GaugeMetricFamily("corral_agent_memory_total_bytes", "Memory the host offers.", labels=label)
        used = GaugeMetricFamily(
            "corral_agent_memory_used_bytes", "Measured resident memory of its sandboxes.", labels=label
        )
        admittable = GaugeMetricFamily(
            "corral_agent_memory_admittable_bytes",
            "Memory the host can still admit (the core's admittable_mb), before starts in flight.",
            labels=label,
        )
        ratio = GaugeMetricFamily(
            "corral_agent_resident_to_committed_ratio",
            "Measured resident memory over configured memory of the sandboxes that have been measured.",
            labels=label,
        )
        sandboxes = GaugeMetricFamily(
            "corral_agent_sandboxes", "Sandboxes the agent accounts for.", labels=label
        )
        in_flight = GaugeMetricFamily("corral_agent_starts_in_flight", "Starts holding a slot.", labels=label)
        intake = GaugeMetricFamily(
            "corral_agent_intake_open", "1 while the pressure gate admits work, 0 while closed.", labels=label
        )
        refusals = CounterMetricFamily(
            "corral_agent_refusals", "Starts refused by this agent, by reason.", labels=[*label, "reason"]
        )
        failures = CounterMetricFamily(
            "corral_agent_heartbeat_failures", "Heartbeats that could not be delivered.", labels=label
        )
        oom_kills = CounterMetricFamily(
            "corral_agent_sandbox_oom_kills",
            "Processes the kernel's OOM killer killed inside this agent's sandboxes (their memory limit).",
            labels=label,
        )
        for agent in self._current():
            a = [agent.id]
            infos = agent.list()
            measured = [i for i in infos if i.resident_mb is not None]
            committed = sum(i.memory_mb for i in measured)
            total.add_metric(a, agent.memory_mb_total * MIB)
            used.add_metric(a, agent.memory_mb_used() * MIB)
            admittable.add_metric(a, agent.admittable_mb() * MIB)
            if committed:
                ratio.add_metric(a, sum(i.resident_mb or 0 for i in measured) / committed)
            sandboxes.add_metric(a, len(infos))
            in_flight.add_metric(a, agent.limiter.in_flight)
            intake.add_metric(a, 1.0 if agent.gate.is_open else 0.0)
            for reason, n in sorted(agent.refusals.items()):
                refusals.add_metric([*a, reason], n)
            failures.add_metric(a, agent.heartbeat_failures)
            oom_kills.add_metric(a, agent.oom_kills_total)
        yield from (
            total,
            used,
            admittable,
            ratio,
            sandboxes,
            in_flight,
            intake,
            refusals,
            failures,
            oom_kills,
        )
        yield from self._warm()
        yield from self._slots()

    def _slots(self) -> Iterator[Metric]:
        slots = GaugeMetricFamily(
            "corral_agent_network_slots",
            "Network slots by state: free (built ahead, in the pool) or in use (held by a sandbox).",
            labels=["agent", "state"],
        )
        on_demand = CounterMetricFamily(
            "corral_agent_network_slots_built_on_demand",
            "Slots built for a start because the pool was drained (it never refuses).",
            labels=["agent"],
        )
        queries = CounterMetricFamily(
            "corral_agent_dns_queries",
            "Queries of sandboxes to their slots' resolver by outcome: answered, refused (the policy), "
            "dropped (over a sandbox's rate or bound in flight, or malformed), failed (SERVFAIL).",
            labels=["agent", "outcome"],
        )
        for agent in self._current():
            if agent.netslots is None:
                continue
            counts = agent.netslots.counts()
            slots.add_metric([agent.id, "free"], counts["free"])
            slots.add_metric([agent.id, "in_use"], counts["in_use"])
            on_demand.add_metric([agent.id], counts["on_demand"])
            if agent.netslots.resolver is not None:
                for outcome, n in dataclasses.asdict(agent.netslots.resolver.totals).items():
                    queries.add_metric([agent.id, outcome], n)
        yield from (slots, on_demand, queries)

    def _warm(self) -> Iterator[Metric]:
        label = ["agent"]
        fill = GaugeMetricFamily(
            "corral_agent_warm_sandboxes",
            "Warm sandboxes per template and state (ready, starting) against the host's target.",
            labels=[*label, "template", "state"],
        )
        claims = CounterMetricFamily("corral_agent_warm_claims", "Warm sandboxes handed over.", labels=label)
        empty = CounterMetricFamily(
            "corral_agent_warm_claims_empty", "Claims answered with none left.", labels=label
        )
        starts = CounterMetricFamily(
            "corral_agent_warm_replenish_starts", "Warm starts begun to meet targets.", labels=label
        )
        evictions = CounterMetricFamily(
            "corral_agent_warm_evictions", "Warm sandboxes stopped to make room for a create.", labels=label
        )
        latency = HistogramMetricFamily(
            "corral_agent_warm_claim_seconds", "The agent's hand-over of one warm sandbox.", labels=label
        )
        for agent in self._current():
            a = [agent.id]
            book, stats = agent.warm, agent.warm.stats
            for template, count in book.counts().items():
                fill.add_metric([*a, template, "ready"], count.ready)
                fill.add_metric([*a, template, "starting"], count.starting)
                fill.add_metric([*a, template, "target"], book.target(template))
            claims.add_metric(a, stats.claims)
            empty.add_metric(a, stats.empty)
            starts.add_metric(a, stats.replenish_starts)
            evictions.add_metric(a, stats.evictions)
            cumulative, buckets = 0, []
            for bound, n in zip([*map(str, CLAIM_BUCKETS_S), "+Inf"], stats.claim_buckets, strict=True):
                cumulative += n
                buckets.append((bound, cumulative))
            latency.add_metric(a, buckets, stats.claim_seconds_sum)
        yield from (fill, claims, empty, starts, evictions, latency)
