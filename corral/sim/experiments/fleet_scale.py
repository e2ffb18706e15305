"""``scale --hosts N --sandboxes M``: what the store absorbs per second of simulated time when N hosts
hold M sandboxes with churn, against the earlier design where every heartbeat carried every id.

The agent's side is the agent's own :class:`~corral.agent.listing.ListingTracker` (what changed since
the acknowledged listing, and its digest); the store's side applies the same rule as
:func:`corral.store.listings.apply`, counted once in :func:`heartbeat_writes` (a test holds it to a
real SQLite store's row counts). Wire sizes are the real :class:`AgentHeartbeat` serialised, for a
sample of hosts' heartbeats. Lifetimes are exponential with mean M / churn: memoryless, so the
sandboxes present at the start have the same remaining-lifetime law and the fleet stays near M.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from corral.agent.config import AgentConfig
from corral.agent.listing import ListingTracker, Outgoing
from corral.agent.protocol import AgentHeartbeat, Capacity
from corral.control.heartbeats import to_store
from corral.core.listing import fold
from corral.core.types import AdmissionMode
from corral.sim.experiments.result import result_json
from corral.store.records import Listing
from corral.store.rows import json_list

# The agent's own default: what a fleet heartbeats at unless told otherwise.
DEFAULT_HEARTBEAT_S: float = AgentConfig.heartbeat_interval_s
# Agents seed seq from wall-clock milliseconds; a realistic one keeps the wire size honest.
_SEQ0 = 1_764_547_200_000
_SENT0 = 1_764_547_200.0


@dataclass(frozen=True, slots=True)
class FleetScenario:
    hosts: int = 10_000
    sandboxes: int = 1_000_000
    churn_per_s: float = 300.0  # creates per second fleet-wide; deletes match them at steady state
    duration_s: float = 60.0
    heartbeat_s: float = DEFAULT_HEARTBEAT_S
    # Hosts whose every heartbeat is built and serialised as the wire model (both designs).
    wire_sample_hosts: int = 200

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.sandboxes < 0 or self.churn_per_s <= 0:
            raise ValueError("hosts must be >= 1, sandboxes >= 0 and churn_per_s > 0")
        if self.duration_s <= 0 or self.heartbeat_s <= 0 or self.wire_sample_hosts < 1:
            raise ValueError("duration_s, heartbeat_s and wire_sample_hosts must be positive")


@dataclass(slots=True)
class Writes:
    """Rows written, by table."""

    hosts: int = 0
    listed_sandboxes: int = 0
    sandboxes: int = 0
    reservations: int = 0

    def add(self, other: Writes, times: int = 1) -> None:
        self.hosts += other.hosts * times
        self.listed_sandboxes += other.listed_sandboxes * times
        self.sandboxes += other.sandboxes * times
        self.reservations += other.reservations * times


# A create: the reservation takes the host's counters and writes its row; the record is inserted,
# then moved to running once the agent started it.
CREATE_WRITES = Writes(hosts=1, reservations=1, sandboxes=2)
# A delete: the record goes. One deleted before a heartbeat confirmed its reservation also cancels it.
DELETE_WRITES = Writes(sandboxes=1)
CANCEL_WRITES = Writes(hosts=1, reservations=1)


def heartbeat_writes(listing: Listing, held: Mapping[str, int], confirmed: int) -> Writes:
    """Rows an accepted heartbeat carrying changes writes (``listing.base`` is the held seq), given the
    listing the store held before it and how many reservations it confirmed: the host's row once (its
    facts, its listing stamp and the confirmed reservations' amounts off its counters); one listing row
    per entry gone (listed or not) and per entry new or at a new epoch; each confirmed reservation's
    row."""
    gone = listing.removed - listing.entries.keys()
    came = sum(1 for sid, epoch in listing.entries.items() if held.get(sid) != epoch)
    return Writes(
        hosts=1,
        listed_sandboxes=len(gone) + came,
        reservations=confirmed,
    )


def listing_of(out: Outgoing) -> Listing:
    """The store's view of a heartbeat's listing, as the control plane decodes it from the wire."""
    return Listing(out.base, out.added, out.gone, out.digest)


@dataclass(frozen=True, slots=True)
class DesignFigures:
    design: str  # "changes" (this one) or "full_list" (every heartbeat carries every id)
    # Rows each table holds at the end (reservations: still unconfirmed when the window closed).
    rows: dict[str, int]
    writes_per_s: dict[str, float]  # rows written per second of simulated time, by kind
    listing_ids_written_per_s: float
    wire_bytes_per_heartbeat: float  # mean over the sampled heartbeats
    wire_bytes_per_s: float
    listing_store_bytes_per_heartbeat: float | None = None


@dataclass(frozen=True, slots=True)
class FleetResult:
    scenario: FleetScenario
    seed: int
    heartbeats: int
    creates: int
    deletes: int
    # Created and deleted between two of its host's heartbeats: reported once, as gone.
    short_lived: int
    # Listing rows written by one more heartbeat per host after the window: what was still unreported.
    listing_rows_after: int
    designs: list[DesignFigures] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return result_json(
            "fleet_scale",
            self.seed,
            self.scenario,
            heartbeats=self.heartbeats,
            creates=self.creates,
            deletes=self.deletes,
            short_lived=self.short_lived,
            listing_rows_after=self.listing_rows_after,
            designs=[asdict(d) for d in self.designs],
        )

    def json_lines(self) -> list[dict[str, Any]]:
        head = {"experiment": "fleet_scale", "seed": self.seed, **asdict(self.scenario)}
        return [{**head, "heartbeats": self.heartbeats, **asdict(d)} for d in self.designs]


def _capacity() -> dict[str, Any]:
    cap = Capacity(
        cpu_total=64.0,
        cpu_used=21.5,
        memory_mb_total=262_144,
        memory_mb_used=101_376,
        memory_admission=AdmissionMode.WORKING_SET,
        memory_mb_admittable=158_720,
        templates=["default", "python"],
        runtime="firecracker",
        max_concurrent_starts=8,
    )
    return cap.model_dump()


def _wire(
    cap: dict[str, Any], host: _Host, out: Outgoing, listing: Listing, at: float
) -> tuple[int, int, int]:
    """Bytes on the wire of this heartbeat as it is (changes) and as the full-list design sent it, and
    the bytes of the id list that design wrote to the store."""
    common = {
        **cap,
        "agent_id": host.name,
        "seq": _SEQ0 + host.seq,
        "address": f"http://{host.name}.fleet.internal:8701",
        "sent_at": _SENT0 + at,
    }
    delta = AgentHeartbeat(
        **common,
        epochs={i: e for i, e in out.added.items() if e},
        base=out.base,
        added=sorted(out.added),
        removed=sorted(out.gone),
        digest=out.digest,
    )
    # The shortcut taken for every other heartbeat is what the wire decodes to.
    if to_store(delta).listing != listing:
        raise AssertionError("the simulated listing differs from the wire's")
    full = AgentHeartbeat(
        **common, sandbox_ids=sorted(host.owned), epochs={i: e for i, e in host.owned.items() if e}
    )
    return (
        len(delta.model_dump_json()),
        len(full.model_dump_json()),
        len(json_list(frozenset(host.owned)) or ""),
    )


class _Host:
    __slots__ = (
        "dropped",
        "held",
        "held_digest",
        "name",
        "outstanding",
        "owned",
        "seq",
        "touched",
        "tracker",
    )

    def __init__(self, name: str, owned: dict[str, int]) -> None:
        self.name = name
        self.owned = owned
        self.touched: set[str] = set()
        self.dropped: set[str] = set()
        self.tracker = ListingTracker()
        self.seq = 1
        # The store's copy of this host's listing, and its digest; acknowledged as a whole at the start.
        first = self.tracker.next(self.seq, owned, set(), set())
        self.tracker.acknowledged(first, self.seq)
        self.held = dict(owned)
        self.held_digest = first.digest
        self.outstanding: set[str] = set()  # sandboxes whose reservation no heartbeat confirmed yet


def _sandbox_id(n: int) -> str:
    # The shape of the control plane's ids ("sb-" and 80 random bits in hex), numbered to stay deterministic.
    return f"sb-{n:020x}"


def run(scn: FleetScenario, seed: int = 1) -> FleetResult:
    rng_pop = random.Random(f"{seed}/fleet_scale/population")
    rng_churn = random.Random(f"{seed}/fleet_scale/churn")
    rng_phase = random.Random(f"{seed}/fleet_scale/phases")
    mean_life = max(scn.sandboxes, 1) / scn.churn_per_s
    horizon = scn.duration_s

    # (time, kind, sandbox id, host): kind 0 is a create, 1 a delete.
    events: list[tuple[float, int, str, int]] = []
    hosts: list[_Host] = []
    per_host, extra = divmod(scn.sandboxes, scn.hosts)
    n = 0
    for h in range(scn.hosts):
        owned: dict[str, int] = {}
        for _ in range(per_host + (1 if h < extra else 0)):
            sid = _sandbox_id(n)
            n += 1
            owned[sid] = 0
            left = rng_pop.expovariate(1.0 / mean_life)
            if left < horizon:
                events.append((left, 1, sid, h))
        hosts.append(_Host(f"host-{h:05d}", owned))
    t = 0.0
    while True:
        t += rng_churn.expovariate(scn.churn_per_s)
        if t >= horizon:
            break
        h = rng_churn.randrange(scn.hosts)
        life = rng_churn.expovariate(1.0 / mean_life)
        sid = _sandbox_id(n)
        n += 1
        events.append((t, 0, sid, h))
        if t + life < horizon:
            events.append((t + life, 1, sid, h))
    events.sort()

    phases = [rng_phase.uniform(0.0, scn.heartbeat_s) for _ in range(scn.hosts)]
    order = sorted(range(scn.hosts), key=phases.__getitem__)
    stride = max(1, scn.hosts // scn.wire_sample_hosts)
    cap = _capacity()

    hb_writes = Writes()
    req_writes = Writes()
    tally = {"creates": 0, "deletes": 0, "short_lived": 0, "gone_rows": 0, "confirming_beats": 0}
    heartbeats = 0
    full_ids = 0  # ids the full-list design writes: every id of every heartbeat
    wire_changes: list[int] = []
    wire_full: list[int] = []
    store_full: list[int] = []

    def happen(kind: int, sid: str, host: _Host) -> None:
        host.touched.add(sid)
        if kind == 0:
            host.owned[sid] = 0
            host.outstanding.add(sid)
            tally["creates"] += 1
            req_writes.add(CREATE_WRITES)
            return
        if sid in host.outstanding:
            host.outstanding.discard(sid)
            tally["short_lived"] += 1
            req_writes.add(CANCEL_WRITES)
        host.owned.pop(sid)
        host.dropped.add(sid)
        tally["deletes"] += 1
        req_writes.add(DELETE_WRITES)

    def beat(h: int, at: float, into: Writes, measure: bool) -> None:
        host = hosts[h]
        host.seq += 1
        out = host.tracker.next(host.seq, host.owned, host.touched, host.dropped)
        host.touched.clear()
        host.dropped.clear()
        listing = listing_of(out)
        if measure and h % stride == 0:
            wire = _wire(cap, host, out, listing, at)
            wire_changes.append(wire[0])
            wire_full.append(wire[1])
            store_full.append(wire[2])
        # The store's side: fold its digest over the changes and check it against the agent's.
        old = {sid: host.held[sid] for sid in listing.removed | listing.entries.keys() if sid in host.held}
        digest = fold(fold(host.held_digest, old.items()), listing.entries.items())
        if out.base is None or digest != listing.digest:
            raise AssertionError(f"{host.name}: the store's copy diverged from the agent's")
        gone = listing.removed - listing.entries.keys()
        for sid in gone:
            host.held.pop(sid, None)
        host.held.update(listing.entries)
        host.held_digest = digest
        confirmed = [sid for sid in host.outstanding if sid in host.held]
        host.outstanding.difference_update(confirmed)
        into.add(heartbeat_writes(listing, old, len(confirmed)))
        if measure and confirmed:
            tally["confirming_beats"] += 1
        tally["gone_rows"] += len(gone)
        host.tracker.acknowledged(out, host.seq)

    at_event = 0
    for k in range(math.ceil(horizon / scn.heartbeat_s)):
        for h in order:
            at = phases[h] + k * scn.heartbeat_s
            if at >= horizon:
                continue
            while at_event < len(events) and events[at_event][0] <= at:
                _, kind, sid, eh = events[at_event]
                at_event += 1
                happen(kind, sid, hosts[eh])
            beat(h, at, hb_writes, True)
            heartbeats += 1
            full_ids += len(hosts[h].owned)
    outstanding = sum(len(x.outstanding) for x in hosts)
    # Events after a host's last heartbeat in the window, then one more heartbeat each: what remained.
    for _, kind, sid, eh in events[at_event:]:
        happen(kind, sid, hosts[eh])
    after = Writes()
    for h in order:
        beat(h, horizon + phases[h], after, False)

    live = sum(len(x.owned) for x in hosts)
    # Present rows, and the rows of entries gone since the start (kept until pruned).
    listed_rows = sum(len(x.held) for x in hosts) + tally["gone_rows"]
    per_s = 1.0 / horizon
    hb_per_s = heartbeats * per_s
    changes = DesignFigures(
        design="changes",
        rows={
            "hosts": scn.hosts,
            "listed_sandboxes": listed_rows,
            "sandboxes": live,
            "reservations": outstanding,
        },
        writes_per_s={
            "heartbeat_host_rows": hb_writes.hosts * per_s,
            "listing_rows": hb_writes.listed_sandboxes * per_s,
            "sandbox_rows": req_writes.sandboxes * per_s,
            "reservation_rows": (hb_writes.reservations + req_writes.reservations) * per_s,
            "reservation_host_rows": req_writes.hosts * per_s,
        },
        listing_ids_written_per_s=hb_writes.listed_sandboxes * per_s,
        wire_bytes_per_heartbeat=statistics.fmean(wire_changes) if wire_changes else 0.0,
        wire_bytes_per_s=(statistics.fmean(wire_changes) if wire_changes else 0.0) * hb_per_s,
    )
    # The earlier design: the host row and the host's whole id list rewritten by every heartbeat.
    full = DesignFigures(
        design="full_list",
        rows={
            "hosts": scn.hosts,
            "host_sandboxes": scn.hosts,
            "sandboxes": live,
            "reservations": outstanding,
        },
        writes_per_s={
            # The host row once, and its counters once more when reservations were confirmed.
            "heartbeat_host_rows": (heartbeats + tally["confirming_beats"]) * per_s,
            "listing_rows": hb_per_s,
            "sandbox_rows": req_writes.sandboxes * per_s,
            "reservation_rows": (hb_writes.reservations + req_writes.reservations) * per_s,
            "reservation_host_rows": req_writes.hosts * per_s,
        },
        listing_ids_written_per_s=full_ids * per_s,
        wire_bytes_per_heartbeat=statistics.fmean(wire_full) if wire_full else 0.0,
        wire_bytes_per_s=(statistics.fmean(wire_full) if wire_full else 0.0) * hb_per_s,
        listing_store_bytes_per_heartbeat=statistics.fmean(store_full) if store_full else 0.0,
    )
    return FleetResult(
        scenario=scn,
        seed=seed,
        heartbeats=heartbeats,
        creates=tally["creates"],
        deletes=tally["deletes"],
        short_lived=tally["short_lived"],
        listing_rows_after=after.listed_sandboxes,
        designs=[changes, full],
    )
