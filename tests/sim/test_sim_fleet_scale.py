"""``scale --hosts``: the store's rows and writes at fleet size follow hosts and churn, not sandboxes,
and the simulation's row accounting is the one a real SQLite store shows."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from corral.agent.listing import ListingTracker, Outgoing
from corral.core import AdmissionMode, HostFacts, ManualClock
from corral.sim.cli import sim_app
from corral.sim.experiments.fleet_scale import (
    FleetResult,
    FleetScenario,
    heartbeat_writes,
    listing_of,
    run,
)
from corral.store import HostReport
from corral.store.sqlite import SqliteStore


def _listing_rows(r: FleetResult) -> int:
    return round(r.designs[0].writes_per_s["listing_rows"] * r.scenario.duration_s)


def test_every_create_and_delete_writes_one_listing_row() -> None:
    r = run(FleetScenario(hosts=100, sandboxes=20_000, churn_per_s=50.0, duration_s=60.0), seed=3)
    assert r.creates > 2_000 and r.deletes > 2_000
    # One row per create and per delete once every host reported; one started and ended between two
    # heartbeats is reported once, as gone.
    assert _listing_rows(r) + r.listing_rows_after == r.creates + r.deletes - r.short_lived
    per_s = r.designs[0].writes_per_s["listing_rows"]
    assert 0.85 * 2 * 50.0 <= per_s <= 1.05 * 2 * 50.0


def test_heartbeat_writes_follow_churn_not_sandboxes() -> None:
    small, big = (
        run(FleetScenario(hosts=100, sandboxes=n, churn_per_s=50.0, duration_s=60.0, wire_sample_hosts=25))
        for n in (2_000, 20_000)
    )
    assert small.heartbeats == big.heartbeats == 100 * 30
    (s, s_full), (b, b_full) = small.designs, big.designs
    host_rows = s.writes_per_s["heartbeat_host_rows"], b.writes_per_s["heartbeat_host_rows"]
    assert abs(host_rows[0] - host_rows[1]) <= 0.02 * host_rows[0]
    listing = s.writes_per_s["listing_rows"], b.writes_per_s["listing_rows"]
    assert abs(listing[0] - listing[1]) <= 0.1 * listing[0]
    assert abs(s.wire_bytes_per_heartbeat - b.wire_bytes_per_heartbeat) <= 0.05 * s.wire_bytes_per_heartbeat
    # The full-list design carries and writes every id every time: ten times the sandboxes, ten times
    # the ids, and the ids' part of each heartbeat grows as much.
    assert 9.5 <= b_full.listing_ids_written_per_s / s_full.listing_ids_written_per_s <= 10.5
    ids_bytes = [
        f.wire_bytes_per_heartbeat - c.wire_bytes_per_heartbeat for c, f in (small.designs, big.designs)
    ]
    assert 8.0 <= ids_bytes[1] / ids_bytes[0] <= 12.0
    assert b_full.wire_bytes_per_heartbeat > 5 * b.wire_bytes_per_heartbeat


def _report(
    host: str, seq: int, tracker: ListingTracker, owned: dict[str, int], touched: set[str], dropped: set[str]
) -> tuple[Outgoing, HostReport]:
    out = tracker.next(seq, owned, touched, dropped)
    facts = HostFacts(
        cpu_total=16.0,
        cpu_used=1.0,
        memory_mb_total=65_536,
        memory_mb_used=1_024,
        memory_mb_admittable=60_000,
        memory_admission=AdmissionMode.WORKING_SET,
    )
    return out, HostReport(host_id=host, seq=seq, facts=facts, listing=listing_of(out))


async def test_the_rows_counted_are_the_rows_sqlite_writes(tmp_path: Path) -> None:
    clock = ManualClock(1000.0)
    store = SqliteStore(str(tmp_path / "fleet.db"), clock=clock)
    await store.migrate()
    try:
        tracker = ListingTracker()
        owned = {"sb-a": 0, "sb-b": 0, "sb-c": 0}
        out, hb = _report("h1", 1, tracker, owned, set(), set())
        tracker.acknowledged(out, (await store.upsert_heartbeat(hb)).listed_seq)
        assert tracker.acked_seq == 1

        # (created, deleted, epoch bumped): a create with a reservation, a delete, a move to a new
        # epoch, one that came and went between two heartbeats (reserved, then cancelled by its delete),
        # nothing at all, and two creates with two deletes.
        steps: list[tuple[dict[str, int], set[str], dict[str, int]]] = [
            ({"sb-d": 0, "sb-e": 0}, {"sb-a", "sb-e"}, {"sb-b": 1}),
            ({}, set(), {}),
            ({"sb-f": 0, "sb-g": 2}, {"sb-c", "sb-d"}, {}),
        ]
        for seq, (created, deleted, bumped) in enumerate(steps, start=2):
            clock.advance(2.0)
            touched: set[str] = set()
            reserved: list[str] = []
            for sid, epoch in created.items():
                res = await store.reserve("h1", memory_mb=256, owner="r1", ttl_s=600.0, sandbox_id=sid)
                assert res is not None
                reserved.append(res.id)
                owned[sid] = epoch
                touched.add(sid)
            for sid in deleted:
                owned.pop(sid)
                touched.add(sid)
                if sid in created:
                    assert await store.cancel(reserved[list(created).index(sid)])
            for sid, epoch in bumped.items():
                owned[sid] = epoch
                touched.add(sid)
            out, hb = _report("h1", seq, tracker, owned, touched, deleted)
            held = await store.listed("h1", hb.listing.removed | hb.listing.entries.keys())
            assert store._writer is not None
            before = store._writer.total_changes
            result = await store.upsert_heartbeat(hb)
            written = store._writer.total_changes - before
            assert result.accepted and result.listed_seq == seq
            assert result.confirmed == len(set(created) - deleted)
            rows = heartbeat_writes(hb.listing, held, result.confirmed)
            assert rows.hosts + rows.listed_sandboxes + rows.sandboxes + rows.reservations == written
            assert rows.listed_sandboxes == sum(
                1 for ch in await store.listing_changes(clock.now()) if ch.changed_at == clock.now()
            )
            tracker.acknowledged(out, result.listed_seq)
        assert await store.listed("h1", set(owned) | {"sb-a", "sb-c"}) == owned
    finally:
        await store.close()


def test_the_command_prints_one_json_line_per_design_and_keeps_the_balls_and_bins() -> None:
    runner = CliRunner()
    res = runner.invoke(
        sim_app, ["scale", "--hosts", "50", "--sandboxes", "2000", "--churn-per-s", "10", "--json"]
    )
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert [x["design"] for x in lines] == ["changes", "full_list"]
    assert all(x["hosts"] == 50 and x["heartbeats"] == 50 * 30 for x in lines)
    assert lines[1]["rows"]["host_sandboxes"] == 50
    res = runner.invoke(sim_app, ["scale", "--hosts", "10", "--churn-per-s", "0", "--json"])
    assert res.exit_code == 2
    assert json.loads(res.stdout)["error"]["code"] == "invalid_scenario"
    res = runner.invoke(sim_app, ["scale", "--hosts", "20", "--sandboxes", "400", "--churn-per-s", "5"])
    assert res.exit_code == 0 and "listing ids written" in res.stdout
