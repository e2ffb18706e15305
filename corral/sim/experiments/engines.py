"""A policy that is a configuration of corral's, as the real flows' fleet runs it: the one place an
experiment's policy and hosts become :class:`~corral.sim.flow.real_fleet.RealFleetConfig`, with the
fleet model's stale cutoff, so both engines judge a host stale at the same age."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from corral.sim.baselines.fleet import ModelFleetConfig
from corral.sim.baselines.policies import Policy
from corral.sim.flow.real_fleet import RealFleetConfig
from corral.sim.scenario import HostSpec


def real_fleet_config(
    pol: Policy, hosts: int, host: HostSpec, view_ttl_s: float, **changes: Any
) -> RealFleetConfig:
    """corral's configuration ``pol`` over ``hosts`` hosts like ``host``: its agents' gate and starts
    limiter, its K, and the fleet model's stale cutoff for the view's TTL."""
    spec = replace(host, gate=pol.agent_gate, starts_limit=pol.starts_limit)
    model = ModelFleetConfig(hosts=hosts, policy=pol, host=spec, view_ttl_s=view_ttl_s)
    return RealFleetConfig(
        hosts=hosts,
        host=spec,
        view_ttl_s=view_ttl_s,
        stale_after_s=model.stale_after,
        k=pol.control_k,
        **changes,
    )
