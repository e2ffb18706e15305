from corral.sim.experiments.density import DensityScenario
from corral.sim.experiments.density import run as run_density
from corral.sim.experiments.leak import LeakScenario
from corral.sim.experiments.leak import run as run_leak
from corral.sim.experiments.scale import ScaleScenario
from corral.sim.experiments.scale import run as run_scale
from corral.sim.experiments.staleness import StalenessScenario
from corral.sim.experiments.staleness import run as run_staleness


def test_working_set_density_exceeds_committed_tenfold_without_oom() -> None:
    r = run_density(DensityScenario(), 1).as_json()
    # Through corral's create flow, real agents and the sim runtime's memory and kernel.
    assert r["engine"] == "create_flow"
    assert r["committed_per_host"] == 7
    assert r["working_set_per_host"] >= 10 * r["committed_per_host"]
    assert r["working_set_oom_events"] == 0 and r["committed_oom_events"] == 0
    # Every create the fleet could not hold was refused by the store's fit, not started and killed.
    assert r["working_set_refusals"]["no_capacity"] > 0


def test_memory_that_grows_after_measurement_is_counted_as_oom_events() -> None:
    scn = DensityScenario(
        duration_s=400.0,
        spike_probability=0.3,
        spike_mb=2048,
        spike_for_s=60.0,
        spike_window_s=(120.0, 400.0),
    )
    r = run_density(scn, 1)
    assert r.working_set.oom_events > 0
    assert r.committed.oom_events == 0
    # The kernel's kills reach the control plane: each agent reads them and its heartbeat puts them
    # on the sandboxes' records (all but those of the last heartbeat or so of the run).
    ws = r.working_set
    assert ws.oom_reportable is not None and ws.oom_reported is not None
    assert ws.oom_events >= ws.oom_reported >= ws.oom_reportable > 0
    # Physical memory never stays above the fleet's: the kernel reclaims what spikes take.
    assert max(p[2] for p in r.working_set.series) <= 1.0


def test_density_through_the_create_flow_replays_by_seed_and_differs_from_the_model() -> None:
    scn = DensityScenario(duration_s=120.0)
    a, b = run_density(scn, 3), run_density(scn, 3)
    assert a == b
    model = run_density(scn, 3, on_model=True)
    assert model.committed.oom_reported is None and a.committed.oom_reported == 0
    assert a.as_json()["engine"] == "create_flow"


def test_old_information_hurts_the_argmax_and_not_power_of_two() -> None:
    scn = StalenessScenario(
        hosts=20,
        replicas=2,
        view_ttls_s=(0.0, 30.0),
        policies=("naive", "power_of_2"),
        warmup_s=60.0,
        measure_s=60.0,
    )
    pts = {(p.policy, p.view_ttl_s): p for p in run_staleness(scn, 1).points}
    assert pts[("naive", 30.0)].max_to_median > 2 * pts[("naive", 0.0)].max_to_median
    assert pts[("power_of_2", 30.0)].max_to_median < pts[("naive", 30.0)].max_to_median
    assert pts[("naive", 30.0)].mean_view_age_s > pts[("naive", 0.0)].mean_view_age_s


def test_two_choices_beat_one_and_a_full_scan_is_perfect() -> None:
    r = run_scale(ScaleScenario(ns=(512,), trials=2, full_scan_max_n=512), 1)
    by = {p.policy: p.max_load for p in r.points}
    assert by["full_scan"] == 1
    assert by["power_of_2"] < by["random"]


def test_reserved_memory_returns_to_zero_after_a_replica_crash() -> None:
    r = run_leak(LeakScenario(), 1)
    for variant in (r.lease, r.ttl_only):
        assert variant.held_by_dead_mb > 0
        assert variant.final_mb == 0 and variant.zero_at_s is not None
    # The lease ends the dead replica's claims long before their TTL would.
    assert r.lease.zero_at_s is not None and r.ttl_only.zero_at_s is not None
    assert r.lease.zero_at_s < r.ttl_only.zero_at_s
    assert r.ttl_only.zero_at_s >= LeakScenario().ledger_ttl_s
    # Through the real reconciler: the leader ends the dead owner's claims once its lease lapses.
    assert r.as_json()["engine"] == "create_flow"
    assert LeakScenario().lease_s <= r.lease.zero_at_s < LeakScenario().ledger_ttl_s
    # The creates the dead replica was placing are settled once its lease lapses, and their clients'
    # retries (same Idempotency-Key) are placed anew. Without a lease, only the create deadline settles
    # them, and it is past the clients' own.
    creates = LeakScenario().burst.creates
    assert r.lease.placed == creates
    assert r.ttl_only.placed < creates


def test_corral_through_its_create_flow_stays_spread_as_views_age() -> None:
    scn = StalenessScenario(
        hosts=10,
        replicas=2,
        policies=("naive", "corral"),
        view_ttls_s=(0.0, 20.0),
        warmup_s=30.0,
        measure_s=30.0,
    )
    pts = {(p.policy, p.view_ttl_s): p for p in run_staleness(scn, 1).points}
    old = pts[("corral", 20.0)]
    # The store ranks the sampled candidates by its live totals: an old view does not pile creates up.
    assert old.mean_view_age_s > pts[("corral", 0.0)].mean_view_age_s
    assert old.max_to_median < pts[("naive", 20.0)].max_to_median
    assert old.max_to_median < 2.0
