"""A heartbeat built from the agent's accounting, and when the next one goes before its time. No I/O
and no clock of its own: the agent measures, hands over what it holds, and sends what comes back here.
The heartbeat's schema is :class:`~corral.agent.protocol.AgentHeartbeat`; how it travels is
:mod:`corral.agent.sinks`."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from corral.agent.listing import ListingTracker, Outgoing
from corral.agent.live import LiveSet
from corral.agent.protocol import ROLE_WARM, AgentHeartbeat, Capacity, WarmCount

# How often sandboxes that are settling are read between heartbeats.
SETTLE_SAMPLE_S = 0.25
# Settled readings send the next heartbeat before its time only when they grow the room the last one
# published by this fraction, or once that one is this old: a fleet creating steadily would otherwise
# have every host beating at the sampling rate, while a host with long intervals still tells its gains
# (and the memory it uses) within seconds.
EARLY_BEAT_GAIN = 0.25
EARLY_BEAT_AFTER_S = 5.0


class HeartbeatBuilder:
    """Numbers heartbeats and lists the host's sandboxes in them: the whole set, or what changed since
    the last heartbeat the control plane acknowledged (see :class:`ListingTracker`)."""

    def __init__(self, agent_id: str, seq: int) -> None:
        self.agent_id = agent_id
        self.seq = seq
        self.listing = ListingTracker()
        # What the host runs for records (id -> epoch), kept in step with the live set and the warm
        # book at each heartbeat, from what changed only.
        self._owned: dict[str, int] = {}
        self._warm_ids: set[str] = set()
        self._outgoing: Outgoing | None = None  # the last heartbeat's listing, until its reply

    def build(
        self,
        cap: Capacity,
        live: LiveSet,
        *,
        roles: Mapping[str, str],
        restore: list[str],
        oom_kills: dict[str, int],
        warm: dict[str, WarmCount],
        address: str,
        now: float,
    ) -> AgentHeartbeat:
        if self._outgoing is not None:
            # The previous heartbeat's reply never came to acknowledge(): the changes it took are
            # not known to have arrived, so this one carries the whole set.
            self.acknowledge_listing(None)
        self.seq += 1
        warm_ids = {i for i, r in roles.items() if r == ROLE_WARM}
        touched, dropped = live.take_changes()
        touched |= warm_ids ^ self._warm_ids
        self._warm_ids = warm_ids
        owned = self._owned
        for i in touched:
            s = live.get(i)
            if s is None or i in warm_ids:
                owned.pop(i, None)
            else:
                owned[i] = s.spec.epoch
        out = self.listing.next(self.seq, owned, touched, dropped)
        whole = out.base is None
        if whole:
            epochs = {i: s.spec.epoch for i, s in live.items() if s.spec.epoch}
        else:
            epochs = {i: e for i, e in out.added.items() if e}
            epochs.update((i, owned[i]) for i in restore if owned.get(i))
        hb = AgentHeartbeat(
            **cap.model_dump(),
            agent_id=self.agent_id,
            seq=self.seq,
            address=address,
            sent_at=now,
            sandbox_ids=sorted(live) if whole else [],
            roles=dict(roles) if whole else {},
            epochs=epochs,
            base=out.base,
            added=[] if whole else sorted(out.added),
            removed=sorted(out.gone),
            digest=out.digest,
            oom_kills=oom_kills,
            restore=restore,
            warm=warm,
        )
        self._outgoing = out
        return hb

    def acknowledge(self, seq: int, listed_seq: int | None) -> None:
        """The reply to heartbeat ``seq`` came (``listed_seq``: the listing the control plane holds)."""
        if self._outgoing is not None and self._outgoing.seq == seq:
            self.acknowledge_listing(listed_seq)

    def acknowledge_listing(self, listed_seq: int | None) -> None:
        out, self._outgoing = self._outgoing, None
        if out is not None:
            self.listing.acknowledged(out, listed_seq)


class EarlyBeat:
    """What the last heartbeat published, against which news is judged: the next heartbeat goes at once
    when the pressure gate opened or closed since (creates sent to a closed host are refused until the
    control plane hears), or when sandboxes that became trusted let the host admit more than it said:
    much more (``EARLY_BEAT_GAIN``), or any more once the last heartbeat is ``EARLY_BEAT_AFTER_S`` old."""

    def __init__(self) -> None:
        self.admittable_mb = 0
        self.intake_open = True
        self.at = 0.0  # by the agent's clock

    def published(self, cap: Capacity, now: float) -> None:
        self.admittable_mb, self.intake_open, self.at = cap.memory_mb_admittable, cap.intake_open, now

    def gate_moved(self, intake_open: bool) -> bool:
        return intake_open != self.intake_open

    def roomier(self, admittable_mb: int, now: float) -> bool:
        gained = admittable_mb - self.admittable_mb
        return gained > 0 and (
            gained >= EARLY_BEAT_GAIN * self.admittable_mb or now - self.at >= EARLY_BEAT_AFTER_S
        )


class ReadingTurns:
    """Which sandboxes a heartbeat's measurement reads. A runtime whose settled readings hold
    (``settled_readings_per_beat``) has the sandboxes old enough to settle read every time and at most
    that many of the rest, taken in turn, so a heartbeat's readings grow neither with the host nor with
    the rate it starts sandboxes at, while each sandbox is still read now and then."""

    def __init__(self) -> None:
        self._turns: list[str] = []
        self._at = 0  # where the next turn starts

    def due(self, share: int, live: Collection[str], settling: Collection[str]) -> list[str] | None:
        """The ids to read (None: all, when the runtime names no ``share``)."""
        if share <= 0:
            return None
        if self._at >= len(self._turns):
            self._turns, self._at = list(live), 0
        turn = self._turns[self._at : self._at + share]
        self._at += share
        return list(settling) + [i for i in turn if i not in settling]
