from corral.core import CreateRequest
from corral.sim.baselines.fleet import ModelFleet, ModelFleetConfig
from corral.sim.baselines.policies import policy
from corral.sim.scenario import HostSpec


def _fleet(seed: int = 3) -> ModelFleet:
    cfg = ModelFleetConfig(hosts=3, policy=policy("corral"), host=HostSpec(heartbeat_s=1.0), view_ttl_s=1.0)
    return ModelFleet(cfg, seed)


def test_a_silent_host_stops_getting_placements_and_gets_them_again_when_it_returns() -> None:
    fleet = _fleet()
    fleet.host_outage(0, start=20.0, end=80.0)
    fleet.poisson(CreateRequest(memory_mb=1024), 5.0, 2.0, 120.0, lifetime_mean_s=5.0)
    h0 = fleet.hosts[0]
    marks: dict[str, int] = {}

    def mark(name: str) -> None:
        marks[name] = h0.admitted

    # stale_after = view_ttl + 3 heartbeats (with jitter), about 4.3 s after its last heartbeat
    fleet.loop.at(30.0, mark, "outage_settled")
    fleet.loop.at(80.0, mark, "returns")
    fleet.loop.at(120.0, mark, "end")
    fleet.run(120.0)
    assert marks["returns"] == marks["outage_settled"]
    assert marks["end"] > marks["returns"]
    assert fleet.metrics.refusals["host_unreachable"] > 0  # binds sent before it looked stale


def test_a_run_replays_exactly_from_its_seed() -> None:
    def trace(seed: int) -> tuple[object, ...]:
        f = _fleet(seed)
        f.poisson(CreateRequest(memory_mb=2048), 3.0, 1.0, 60.0, lifetime_mean_s=20.0)
        f.crash_replica(0, 30.0)
        f.run(60.0)
        return (dict(f.metrics.placements), dict(f.metrics.refusals), f.live_counts(), f.loop.processed)

    assert trace(11) == trace(11)
    assert trace(11) != trace(12)


def test_with_no_live_replica_creates_are_refused_and_retried_until_the_deadline() -> None:
    fleet = _fleet()
    fleet.crash_replica(0, 0.5)
    fleet.submit(CreateRequest(memory_mb=1024), at=2.0)
    fleet.run(200.0)
    assert fleet.metrics.placed == 0
    assert fleet.metrics.refusals["no_replica"] >= 1
    assert fleet.metrics.refusals["gave_up"] == 1
