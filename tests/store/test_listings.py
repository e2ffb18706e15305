"""Hosts' listings: a heartbeat of changes applies only on the listing it was built on and only if the
digests agree; whole sets replace; reservations are confirmed from the host's outstanding ones."""

from __future__ import annotations

from corral.core import ManualClock
from corral.core.listing import digest_of
from corral.store import Listing, SandboxState, Store, disputed

from .helpers import beat, sandbox


def changes(
    base: int, now: dict[str, int], added: dict[str, int], removed: frozenset[str] = frozenset()
) -> Listing:
    """A listing of changes from ``base`` whose digest is that of ``now``, the set after them."""
    return Listing(base, added, frozenset(removed), digest_of(now))


async def test_changes_apply_on_the_listing_they_build_on(store: Store) -> None:
    first = await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset({"sb-a", "sb-b"})))
    assert first.listed_seq == 1 and first.host.sandbox_count == 2
    after = {"sb-b": 0, "sb-c": 3}
    second = await store.upsert_heartbeat(beat("h1", 2, listing=changes(1, after, {"sb-c": 3}, {"sb-a"})))
    assert second.accepted and second.listed_seq == 2 and second.host.sandbox_count == 2
    assert await store.listed("h1", ["sb-a", "sb-b", "sb-c"]) == after
    # An epoch that changed is one entry gone and one come: the count stays, the digest follows.
    moved = {"sb-b": 0, "sb-c": 4}
    third = await store.upsert_heartbeat(beat("h1", 3, listing=changes(2, moved, {"sb-c": 4}, {"sb-c"})))
    assert third.listed_seq == 3 and third.host.sandbox_count == 2
    assert await store.listed("h1", ["sb-c"]) == {"sb-c": 4}
    # Nothing changed: the digest alone is checked, and the listing moves on to this heartbeat.
    quiet = await store.upsert_heartbeat(beat("h1", 4, listing=changes(3, moved, {})))
    assert quiet.listed_seq == 4


async def test_changes_on_another_base_are_not_applied(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset({"sb-a"})))
    await store.upsert_heartbeat(beat("h1", 2, listing=changes(1, {"sb-a": 0, "sb-b": 0}, {"sb-b": 0})))
    # The reply to 2 was lost: the agent builds 3 on 1 again. The store holds 2's listing, not 1's.
    lost_reply = await store.upsert_heartbeat(
        beat("h1", 3, listing=changes(1, {"sb-a": 0, "sb-c": 0}, {"sb-c": 0}))
    )
    assert lost_reply.accepted and lost_reply.listed_seq == 2  # not 3: send the whole set
    assert await store.listed("h1", ["sb-a", "sb-b", "sb-c"]) == {"sb-a": 0, "sb-b": 0}
    whole = await store.upsert_heartbeat(beat("h1", 4, sandbox_ids=frozenset({"sb-a", "sb-c"})))
    assert whole.listed_seq == 4 and whole.host.sandbox_count == 2
    assert await store.listed("h1", ["sb-a", "sb-b", "sb-c"]) == {"sb-a": 0, "sb-c": 0}


async def test_a_digest_that_disagrees_untrusts_the_listing_until_the_whole_set(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset({"sb-a"})))
    # The agent believes it also runs sb-z, which the store never heard of: the digests differ.
    wrong = await store.upsert_heartbeat(
        beat("h1", 2, listing=changes(1, {"sb-a": 0, "sb-z": 0, "sb-b": 0}, {"sb-b": 0}))
    )
    assert wrong.accepted and wrong.listed_seq is None
    # Nothing builds on an untrusted listing, not even changes naming its old seq.
    again = await store.upsert_heartbeat(beat("h1", 3, listing=changes(1, {"sb-a": 0}, {})))
    assert again.listed_seq is None
    whole = await store.upsert_heartbeat(beat("h1", 4, sandbox_ids=frozenset({"sb-a", "sb-z", "sb-b"})))
    assert whole.listed_seq == 4 and whole.host.sandbox_count == 3


async def test_delayed_and_duplicated_heartbeats_change_nothing(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset({"sb-a"})))
    two = beat("h1", 2, listing=changes(1, {"sb-a": 0, "sb-b": 0}, {"sb-b": 0}))
    assert (await store.upsert_heartbeat(two)).listed_seq == 2
    dup = await store.upsert_heartbeat(two)
    assert not dup.accepted and dup.listed_seq == 2
    late = await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset()))
    assert not late.accepted and late.host.sandbox_count == 2
    assert await store.listed("h1", ["sb-a", "sb-b"]) == {"sb-a": 0, "sb-b": 0}


async def test_what_went_is_seen_going_and_then_pruned(store: Store, clock: ManualClock) -> None:
    t0 = clock.now()
    await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset({"sb-a"})))
    clock.advance(10)
    # sb-q started and ended between two heartbeats: never listed, still reported gone.
    await store.upsert_heartbeat(beat("h1", 2, listing=changes(1, {}, {}, {"sb-a", "sb-q"})))
    seen = {(c.sandbox_id, c.present) for c in await store.listing_changes(t0 + 5)}
    assert seen == {("sb-a", False), ("sb-q", False)}
    assert {(c.sandbox_id, c.present) for c in await store.listing_changes(t0)} == seen
    assert (await store.get_host("h1")).sandbox_count == 0  # type: ignore[union-attr]
    assert await store.prune_listings(t0 + 5) == 0
    assert await store.prune_listings(t0 + 11) == 2
    assert await store.listing_changes(t0) == []


async def test_a_whole_set_the_store_already_holds_writes_no_entry(store: Store, clock: ManualClock) -> None:
    ids = frozenset({"sb-a", "sb-b"})
    await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=ids))
    clock.advance(10)
    same = beat(
        "h1", 2, listing=Listing(None, dict.fromkeys(ids, 0), digest=digest_of(dict.fromkeys(ids, 0)))
    )
    result = await store.upsert_heartbeat(same)
    assert result.listed_seq == 2 and result.host.listed_at == clock.now()
    assert await store.listing_changes(clock.now()) == []


async def test_a_whole_set_marks_gone_what_a_record_says_runs_there(store: Store, clock: ManualClock) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    await store.upsert_heartbeat(beat("h1", 1))
    await store.create_sandbox(sandbox("sb-r", tenant, host_id="h1", state=SandboxState.RUNNING))
    clock.advance(5)
    # The agent restarted without it (it died between two heartbeats, unlisted): its whole set lacks it.
    await store.upsert_heartbeat(beat("h1", 2, sandbox_ids=frozenset({"sb-a"})))
    seen = {(c.sandbox_id, c.present) for c in await store.listing_changes(clock.now())}
    assert seen == {("sb-r", False), ("sb-a", True)}
    assert await store.listed_hosts(["sb-a", "sb-r"]) == {"sb-a": "h1"}


async def test_confirmation_reads_the_hosts_outstanding_reservations(store: Store) -> None:
    await store.upsert_heartbeat(beat("h1", 1, sandbox_ids=frozenset({"sb-a"})))
    # Reserved after its sandbox was listed (a create that outran its reservation's write):
    # the next heartbeat changes nothing, yet confirms it from the listing the store holds.
    r = await store.reserve("h1", memory_mb=100, owner="o", ttl_s=60, sandbox_id="sb-a")
    pending = await store.reserve("h1", memory_mb=100, owner="o", ttl_s=60, sandbox_id="sb-b")
    assert r is not None and pending is not None
    quiet = await store.upsert_heartbeat(beat("h1", 2, listing=changes(1, {"sb-a": 0}, {})))
    assert quiet.confirmed == 1 and await store.get_reservation(r.id) is None
    # Changes that do not apply (a lost reply) still show their sandboxes: they run there.
    stale = await store.upsert_heartbeat(
        beat("h1", 3, listing=changes(1, {"sb-a": 0, "sb-b": 0}, {"sb-b": 0}))
    )
    assert stale.listed_seq == 2 and stale.confirmed == 1
    assert await store.get_reservation(pending.id) is None


async def test_committed_memory_is_read_from_the_tenants_counters(store: Store) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    await store.upsert_heartbeat(beat("h1", 1))
    await store.create_sandbox(
        sandbox("sb-1", tenant, host_id="h1", state=SandboxState.RUNNING, memory_mb=300)
    )
    await store.create_sandbox(
        sandbox("sb-2", tenant, host_id="h1", state=SandboxState.RUNNING, memory_mb=200)
    )
    await store.create_sandbox(
        sandbox("sb-3", tenant, host_id="h1", state=SandboxState.ORPHANED, memory_mb=50)
    )
    other = await store.create_tenant("u", max_sandboxes=10, max_memory_mb=10_000)
    await store.create_sandbox(sandbox("sb-4", other, host_id="h1", state=SandboxState.RUNNING, memory_mb=25))
    assert await store.committed_mb() == 575  # every tenant's live sandboxes, the orphan's included
    await store.set_sandbox_state("sb-4", SandboxState.STOPPED)
    assert await store.committed_mb() == 550
    got = await store.get_sandboxes(["sb-1", "sb-3", "sb-none"])
    assert set(got) == {"sb-1", "sb-3"} and got["sb-3"].state is SandboxState.ORPHANED


async def test_an_agent_older_than_changes_sends_whole_sets_that_each_replace(store: Store) -> None:
    # No digest, no base: every heartbeat is the whole set, taken as it is (the reply's listed_seq,
    # which such an agent ignores, names it all the same).
    for seq, ids in enumerate([{"sb-a", "sb-b"}, {"sb-b"}, {"sb-b", "sb-c"}], start=1):
        result = await store.upsert_heartbeat(beat("h1", seq, sandbox_ids=frozenset(ids)))
        assert result.listed_seq == seq and result.host.sandbox_count == len(ids)
        assert set(await store.listed("h1", ["sb-a", "sb-b", "sb-c"])) == ids


async def test_disputes_are_the_changes_a_record_disputes(store: Store, clock: ManualClock) -> None:
    tenant = await store.create_tenant("t", max_sandboxes=10, max_memory_mb=10_000)
    running = SandboxState.RUNNING
    await store.upsert_heartbeat(beat("h1", 1))
    await store.upsert_heartbeat(beat("h2", 1))
    await store.create_sandbox(sandbox("sb-here", tenant, host_id="h1", state=running))
    await store.create_sandbox(sandbox("sb-there", tenant, host_id="h2", state=running))
    await store.create_sandbox(sandbox("sb-placing", tenant))  # reserved: claims no host yet
    await store.create_sandbox(sandbox("sb-died", tenant, host_id="h1", state=running))
    await store.create_sandbox(sandbox("sb-ended", tenant, host_id="h1", state=SandboxState.STOPPED))
    clock.advance(1)
    await store.upsert_heartbeat(
        beat("h1", 2, sandbox_ids=frozenset({"sb-here", "sb-there", "sb-placing", "sb-nobody"}))
    )
    left = dict.fromkeys(("sb-there", "sb-placing", "sb-nobody"), 0)
    await store.upsert_heartbeat(beat("h1", 3, listing=changes(2, left, {}, {"sb-here", "sb-ended"})))
    every = await store.listing_changes(0.0)
    disputed_here = {(c.host_id, c.sandbox_id, c.present) for c in await store.listing_disputes(0.0)}
    # sb-there runs on h2 by its record; sb-nobody has none; sb-here went from where its record puts
    # it, and so did sb-died, never listed by h1's whole set. Stopped or still placing: no dispute.
    assert disputed_here == {
        ("h1", "sb-there", True),
        ("h1", "sb-nobody", True),
        ("h1", "sb-here", False),
        ("h1", "sb-died", False),
    }
    records = await store.get_sandboxes({c.sandbox_id for c in every})
    assert disputed_here == {
        (c.host_id, c.sandbox_id, c.present) for c in every if disputed(c, records.get(c.sandbox_id))
    }
    assert await store.listing_disputes(clock.now() + 1) == []
