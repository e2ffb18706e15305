"""A host's images, as its heartbeats name them: kept on its row, and scored by the store's pick as the
core scores them (a host that holds the create's image above one that must fetch it, never a filter)."""

from __future__ import annotations

from corral.store import Store

from .helpers import beat

IMG = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32


async def test_a_heartbeat_s_images_are_kept_on_the_host_row(store: Store) -> None:
    await store.upsert_heartbeat(beat("h00", 1, images=frozenset({IMG, OTHER})))
    host = await store.get_host("h00")
    assert host is not None and host.images == frozenset({IMG, OTHER})
    await store.upsert_heartbeat(beat("h00", 2, images=frozenset()))
    assert [h.images for h in await store.list_hosts()] == [frozenset()]


async def test_the_pick_prefers_a_host_holding_the_image_and_never_refuses_for_one(store: Store) -> None:
    await store.upsert_heartbeat(beat("h00", 1, admittable=10_000))
    await store.upsert_heartbeat(beat("h01", 1, admittable=10_000, images=frozenset({OTHER, IMG})))
    await store.upsert_heartbeat(beat("h02", 1, admittable=10_000, images=frozenset({OTHER})))
    for i in range(4):  # whatever the tie-break salt, the holder of equal room wins
        got = await store.reserve_best(
            ["h00", "h01", "h02"], memory_mb=10, owner="r", ttl_s=60, sandbox_id=f"sb{i}", image=IMG
        )
        assert got is not None and got.host_id == "h01"
    # A bonus, not a filter: much more room elsewhere still wins, and a lack of holders refuses nothing.
    await store.upsert_heartbeat(beat("h00", 2, admittable=14_000))
    got = await store.reserve_best(["h00", "h01"], memory_mb=10, owner="r", ttl_s=60, image=IMG)
    assert got is not None and got.host_id == "h00"
    got = await store.reserve_best(["h02"], memory_mb=10, owner="r", ttl_s=60, image=IMG)
    assert got is not None and got.host_id == "h02"
