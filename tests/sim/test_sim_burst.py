import pytest

from corral.sim.experiments.burst import BurstScenario, run


def test_same_seed_same_result_and_every_host_is_present() -> None:
    scn = BurstScenario(replicas=4, policy="corral", split="random")
    a, b = run(scn, 7), run(scn, 7)
    assert a.as_json() == b.as_json()
    assert sorted(a.per_host) == [f"h{i:02d}" for i in range(12)]
    assert sum(a.per_host.values()) == a.placed == 50


def test_naive_piles_the_burst_onto_one_host() -> None:
    r = run(BurstScenario(replicas=1, policy="naive"), 1)
    assert r.max >= 45
    assert r.max_to_median is None  # the median host got nothing


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_default_policy_spreads_with_four_replicas(seed: int) -> None:
    r = run(BurstScenario(replicas=4), seed)
    assert r.scenario.policy == "corral"
    # Twelve hosts are few enough to offer the store every one, which then takes the roomiest by its
    # current totals: fifty creates land within one of the mean (4.2), never a pile-up.
    assert r.max <= 5
    assert r.max_to_median is not None and r.max_to_median <= 1.25
    # Every create is placed, and every reservation ends once a heartbeat lists its sandbox.
    assert r.placed == 50
    assert r.outstanding_mb_after == 0


def test_corral_runs_through_its_own_create_flow_and_the_baselines_through_the_model() -> None:
    real = run(BurstScenario(replicas=2), 3).as_json()
    model = run(BurstScenario(replicas=2, policy="shared_ledger"), 3).as_json()
    assert real["engine"] == "create_flow" and model["engine"] == "model"
    # The real flow's view ages come from each replica's ViewCache, read at its own moment.
    assert 0 < real["mean_view_age_s"] <= BurstScenario().view_ttl_s


def test_per_replica_ledgers_pile_up_again_with_more_replicas_and_a_shared_one_does_not() -> None:
    one = run(BurstScenario(replicas=1, policy="reservations"), 1)
    four = run(BurstScenario(replicas=4, policy="reservations"), 1)
    shared = run(BurstScenario(replicas=4, policy="shared_ledger"), 1)
    assert four.max > one.max
    assert shared.max == one.max


def test_a_fresh_host_draws_each_replicas_share_under_per_replica_ledgers() -> None:
    four = run(BurstScenario(replicas=4, policy="reservations", fresh_host=True), 1)
    corral = run(BurstScenario(replicas=4, policy="corral", fresh_host=True), 1)
    assert four.max > 50 / 4
    assert corral.max < four.max


@pytest.mark.parametrize("bad", [{"policy": "nope"}, {"creates": 0}, {"split": "sideways"}])
def test_bad_scenarios_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        run(BurstScenario(**bad), 1)  # type: ignore[arg-type]
