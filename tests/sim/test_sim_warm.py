"""The warm experiment: argmax over a stale inventory drains one host; corral's claim path (its own
create flow, pools, agents and store model) does not."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from corral.cli import app
from corral.sim.experiments.warm import WarmScenario, run


def test_argmax_drains_one_host_and_corral_spreads() -> None:
    r = run(WarmScenario(), 1)
    by = {o.policy: o for o in r.outcomes}
    argmax, p2, corral = by["argmax"], by["power_of_2"], by["corral"]
    assert argmax.hosts_with_cold == 1 and argmax.misses == max(argmax.cold_per_host.values())
    assert argmax.hits == max(r.warm_at_start.values())  # only the warmest host's sandboxes were used
    assert corral.hits >= p2.hits > argmax.hits
    assert corral.hits >= 98 and corral.max_over_mean <= 1.5
    # corral's numbers come from its create flow: agents filled the pool's targets and handed over
    # what the replica claimed, one agent answer per claim when no pick was stale.
    assert corral.engine == "create_flow" and argmax.engine == p2.engine == "model"
    assert corral.asked == corral.hits and corral.drained == 0
    for o in r.outcomes:
        assert o.hits + o.misses == 100 and sum(o.per_host.values()) == 100
        assert o.hits <= sum(r.warm_at_start.values())


def test_corral_never_takes_more_than_a_host_holds_and_replays_by_seed() -> None:
    s = WarmScenario(hosts=5, warm_min=0, warm_max=3, claims=40, replicas=3)
    a, b = run(s, 9), run(s, 9)
    assert a == b
    total = sum(a.warm_at_start.values())
    for o in a.outcomes:
        assert o.hits <= total and o.misses == 40 - o.hits


def test_with_a_fresh_inventory_corral_misses_only_when_the_fleet_is_empty() -> None:
    # Refreshed before every claim: nothing is stale, so corral misses only when the fleet is empty.
    r = run(WarmScenario(claims=150, refresh_s=0.001), 2)
    corral = next(o for o in r.outcomes if o.policy == "corral")
    assert corral.hits == sum(r.warm_at_start.values())


def test_a_refilled_sandbox_is_claimed_only_once_a_heartbeat_advertises_it() -> None:
    # More claims than the fleet holds, inside one heartbeat interval: with refills on, the agents
    # refill as the burst drains them, but the replica claims only what heartbeats advertised.
    s = WarmScenario(claims=200, policies=("corral",))
    still = run(s, 1).outcomes[0]
    refilled = run(replace(s, refill=True), 1).outcomes[0]
    total = sum(run(s, 1).warm_at_start.values())
    assert still.hits == refilled.hits == total
    assert still.drained == s.hosts and refilled.drained == 0
    # On the inventory model the same claim rule finds the same sandboxes.
    assert run(s, 1, on_model=True).outcomes[0].hits == total


@pytest.mark.parametrize(
    "bad", [{"hosts": 0}, {"warm_min": 5, "warm_max": 2}, {"policies": ("nope",)}, {"refresh_s": 0}]
)
def test_bad_scenarios_are_refused(bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ValueError):
        WarmScenario(**bad)


def test_cli_json_and_bad_input() -> None:
    out = CliRunner().invoke(app, ["sim", "warm", "--json", "--claims", "30"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert data["experiment"] == "warm" and len(data["outcomes"]) == 3
    out = CliRunner().invoke(app, ["sim", "warm", "--json", "--hosts", "0"])
    assert out.exit_code == 2 and "invalid_scenario" in out.stdout
