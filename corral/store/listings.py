"""Hosts' listings in the SQL backends: one row per sandbox a host runs for a record, changed by each
heartbeat in proportion to what it changed, never to what the host runs.

A row whose ``present`` is false is an entry that went (or a sandbox a heartbeat said ended before it was
ever listed); it stays until pruned so the reconciler, which reads rows by ``changed_at``, sees it go.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from corral.core.listing import digest_of, fold
from corral.store.records import HostReport, Listing, ListingChange, SandboxState
from corral.store.rows import in_list

if TYPE_CHECKING:
    from corral.store.sql import Tx

# Ids per statement when a list of them is bound: far below every backend's parameter limit.
CHUNK = 500

_UPSERT = (
    "INSERT INTO listed_sandboxes (host_id, sandbox_id, epoch, present, changed_at) "
    "VALUES (:h, :s, :e, :p, :now) ON CONFLICT (host_id, sandbox_id) DO UPDATE SET "
    "epoch = excluded.epoch, present = excluded.present, changed_at = excluded.changed_at"
)


def chunks(ids: Collection[str]) -> Iterator[list[str]]:
    ordered = sorted(ids)
    for at in range(0, len(ordered), CHUNK):
        yield ordered[at : at + CHUNK]


async def held_entries(tx: Tx, host_id: str, sandbox_ids: Collection[str]) -> dict[str, int]:
    """Of ``sandbox_ids``, those the host's listing holds, with their epochs."""
    out: dict[str, int] = {}
    for part in chunks(sandbox_ids):
        clause, params = in_list("x", part)
        for sid, epoch in await tx.fetchall(
            "SELECT sandbox_id, epoch FROM listed_sandboxes "
            f"WHERE host_id = :h AND present = :yes AND sandbox_id IN {clause}",
            {"h": host_id, "yes": True, **params},
        ):
            out[str(sid)] = int(epoch)
    return out


@dataclass(frozen=True, slots=True)
class Stamp:
    """A host's listing columns as a heartbeat leaves them: the seq of the listing held (None: none to
    trust, send the whole set), its digest, when it was last written, and how many entries it holds."""

    seq: int | None
    digest: int
    at: float
    count: int


async def apply(tx: Tx, hb: HostReport, held: Stamp, now: float) -> Stamp:
    """Bring the host's listing rows up to ``hb`` (the host's row is locked, and written once after
    this with the stamp returned). The stamp's seq is ``hb.seq`` if the store now holds this heartbeat's
    listing; any other seq tells the agent to send its whole set."""
    listing = hb.listing
    if listing.base is None:
        await _replace(tx, hb.host_id, listing, now, held.seq is None, held.digest)
        return Stamp(hb.seq, digest_of(listing.entries), now, len(listing.entries))
    if listing.base != held.seq:
        # Built on a listing the store does not hold (a reply was lost, a heartbeat overtaken, the
        # store's copy marked untrusted): applying it could only diverge. The held one stays.
        return held
    old = await held_entries(tx, hb.host_id, listing.removed | listing.entries.keys())
    digest = fold(fold(held.digest, old.items()), listing.entries.items())
    if listing.digest is not None and digest != listing.digest:
        # The two copies disagree: this one is not to be trusted until the whole set comes.
        return Stamp(None, held.digest, held.at, held.count)
    gone = [
        {"h": hb.host_id, "s": sid, "e": old.get(sid, 0), "p": False, "now": now}
        for sid in sorted(listing.removed - listing.entries.keys())
    ]
    came = [
        {"h": hb.host_id, "s": sid, "e": epoch, "p": True, "now": now}
        for sid, epoch in sorted(listing.entries.items())
        if old.get(sid) != epoch
    ]
    if gone or came:
        await tx.executemany(_UPSERT, gone + came)
    added = len(listing.entries.keys() - old.keys()) - sum(1 for row in gone if row["s"] in old)
    return Stamp(hb.seq, digest, now, held.count + added)


async def _replace(
    tx: Tx, host_id: str, listing: Listing, now: float, untrusted: bool, held_digest: int
) -> None:
    """A whole set. The same set the store holds (its digest says so: a reply was lost) writes
    nothing; otherwise what changed is written. Where the store held no listing to trust, every entry
    is written anew, stamped now, so the reconciler looks at each again. Either way, a sandbox a
    record says runs here that the host never listed is written as gone. Costs the host's size, but
    only after a restart, a lost reply or a divergence."""
    if untrusted or listing.digest is None or listing.digest != held_digest:
        before: dict[str, int] = {}
        if untrusted:
            await tx.execute("DELETE FROM listed_sandboxes WHERE host_id = :h", {"h": host_id})
        else:
            for sid, epoch, present in await tx.fetchall(
                "SELECT sandbox_id, epoch, present FROM listed_sandboxes WHERE host_id = :h", {"h": host_id}
            ):
                if present:
                    before[str(sid)] = int(epoch)
        came = [
            {"h": host_id, "s": sid, "e": epoch, "p": True, "now": now}
            for sid, epoch in sorted(listing.entries.items())
            if before.get(sid) != epoch
        ]
        gone = [
            {"h": host_id, "s": sid, "e": epoch, "p": False, "now": now}
            for sid, epoch in sorted(before.items())
            if sid not in listing.entries
        ]
        if came or gone:
            await tx.executemany(_UPSERT, came + gone)
    await tx.execute(
        "INSERT INTO listed_sandboxes (host_id, sandbox_id, epoch, present, changed_at) "
        "SELECT host_id, id, epoch, :no, :now FROM sandboxes WHERE host_id = :h AND state = 'running' "
        "ON CONFLICT (host_id, sandbox_id) DO NOTHING",
        {"h": host_id, "no": False, "now": now},
    )


async def confirm(tx: Tx, hb: HostReport) -> tuple[int, int, int]:
    """End the host's outstanding reservations whose sandbox it lists (now, or in this heartbeat's
    changes if they did not apply): read from its few outstanding reservations, never from its whole
    listing. Returns how many ended and the memory and CPU (milli) they held, for the caller to take
    off the host's counters in its own write of the host's row."""
    outstanding = await tx.fetchall(
        "SELECT id, sandbox_id FROM reservations WHERE host_id = :h AND sandbox_id IS NOT NULL",
        {"h": hb.host_id},
    )
    if not outstanding:
        return 0, 0, 0
    # Most are confirmed by the very heartbeat that first lists their sandbox: the store is asked
    # only about the rest.
    listed = hb.listing.entries
    shown = await held_entries(tx, hb.host_id, {str(sid) for _, sid in outstanding if sid not in listed})
    done = sorted(str(rid) for rid, sid in outstanding if sid in listed or sid in shown)
    ended = mb = cpu_m = 0
    for part in chunks(done):
        clause, params = in_list("r", part)
        for got_mb, got_cpu in await tx.fetchall(
            f"DELETE FROM reservations WHERE id IN {clause} RETURNING memory_mb, cpu_m", params
        ):
            ended, mb, cpu_m = ended + 1, mb + int(got_mb), cpu_m + int(got_cpu)
    return ended, mb, cpu_m


async def fences(tx: Tx, host_id: str) -> frozenset[str]:
    """The sandboxes this host lists at an epoch older than their fence: it must stop them. A fence
    whose copy the host no longer lists (or lists at a current epoch) has done its work and goes."""
    got = await tx.fetchall("SELECT sandbox_id, epoch FROM fences WHERE host_id = :h", {"h": host_id})
    if not got:
        return frozenset()
    listed = await held_entries(tx, host_id, {str(sid) for sid, _ in got})
    fenced = frozenset(str(sid) for sid, epoch in got if sid in listed and listed[sid] < int(epoch))
    for part in chunks({str(sid) for sid, _ in got} - fenced):
        clause, params = in_list("d", part)
        await tx.execute(
            f"DELETE FROM fences WHERE host_id = :h AND sandbox_id IN {clause}", {"h": host_id, **params}
        )
    return fenced


async def changes(tx: Tx, since: float) -> list[ListingChange]:
    return [
        ListingChange(str(h), str(s), bool(p), float(at))
        for h, s, p, at in await tx.fetchall(
            "SELECT host_id, sandbox_id, present, changed_at FROM listed_sandboxes "
            "WHERE changed_at >= :since ORDER BY changed_at",
            {"since": since},
        )
    ]


async def disputes(tx: Tx, since: float) -> list[ListingChange]:
    """The entries changed at or after ``since`` that their sandbox's record disputes (the rule is
    :func:`corral.store.records.disputed`, written as a query). Entries both sides agree on, nearly all of them, are
    never read out of the database."""
    return [
        ListingChange(str(h), str(s), bool(p), float(at))
        for h, s, p, at in await tx.fetchall(
            "SELECT l.host_id, l.sandbox_id, l.present, l.changed_at FROM listed_sandboxes l "
            "LEFT JOIN sandboxes s ON s.id = l.sandbox_id WHERE l.changed_at >= :since AND ("
            "(l.present = :yes AND (s.id IS NULL OR (s.host_id IS NOT NULL AND s.host_id <> l.host_id "
            "AND s.state <> :reserved))) "
            "OR (l.present = :no AND s.state = :running AND s.host_id = l.host_id)) "
            "ORDER BY l.changed_at",
            {
                "since": since,
                "yes": True,
                "no": False,
                "reserved": SandboxState.RESERVED.value,
                "running": SandboxState.RUNNING.value,
            },
        )
    ]


async def hosts_of(tx: Tx, sandbox_ids: Collection[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in chunks(sandbox_ids):
        clause, params = in_list("x", part)
        for sid, host in await tx.fetchall(
            f"SELECT sandbox_id, host_id FROM listed_sandboxes WHERE present = :yes AND sandbox_id IN {clause}",
            {"yes": True, **params},
        ):
            out[str(sid)] = str(host)
    return out
