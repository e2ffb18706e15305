"""Agents' heartbeats into the state of record. The store confirms, in the same transaction, every
reservation whose sandbox the heartbeat shows: the agent's admittable now counts it."""

from __future__ import annotations

from corral.agent.protocol import AgentHeartbeat
from corral.control.metrics import Metrics
from corral.control.ports import HeartbeatSink
from corral.store import HeartbeatResult, HostReport, Listing


def to_store(hb: AgentHeartbeat) -> HostReport:
    # Warm sandboxes are no record's: they must neither confirm a reservation nor look stray.
    if hb.base is None:
        listing = Listing(None, {i: hb.epochs.get(i, 0) for i in hb.owned_ids()}, digest=hb.digest)
    else:
        added = {i: hb.epochs.get(i, 0) for i in hb.added}
        listing = Listing(hb.base, added, frozenset(hb.removed), hb.digest)
    return HostReport(
        host_id=hb.agent_id,
        seq=hb.seq,
        facts=hb.facts(),
        listing=listing,
        address=hb.address,
        warm={t: (c.ready, c.starting) for t, c in hb.warm.items()},
    )


class HeartbeatIntake:
    def __init__(self, store: HeartbeatSink, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        # Host -> the OOM counts it last reported and the store has: a heartbeat repeats them all,
        # only a rise needs a write.
        self._oom_recorded: dict[str, dict[str, int]] = {}

    async def accept(self, hb: AgentHeartbeat) -> HeartbeatResult:
        result = await self.store.upsert_heartbeat(to_store(hb))
        self.metrics.heartbeats.labels("true" if result.accepted else "false").inc()
        if result.accepted:
            await self._record_oom_kills(hb.agent_id, hb.oom_kills)
        return result

    async def _record_oom_kills(self, host_id: str, counts: dict[str, int]) -> None:
        recorded = self._oom_recorded.get(host_id, {})
        risen = {sid: n for sid, n in counts.items() if n > recorded.get(sid, 0)}
        if risen:
            await self.store.record_oom_kills(host_id, risen)
        if counts:
            self._oom_recorded[host_id] = dict(counts)  # forgets the sandboxes the host no longer has
        else:
            self._oom_recorded.pop(host_id, None)
