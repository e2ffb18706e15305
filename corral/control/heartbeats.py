"""Agents' heartbeats into the state of record. The store confirms, in the same transaction, every
reservation whose sandbox the heartbeat shows: the agent's admittable now counts it."""

from __future__ import annotations

from corral.agent.protocol import Heartbeat as WireHeartbeat
from corral.control.metrics import Metrics
from corral.store import Heartbeat, HeartbeatResult, Store


def to_store(hb: WireHeartbeat) -> Heartbeat:
    return Heartbeat(
        host_id=hb.agent_id,
        seq=hb.seq,
        cpu_total=hb.cpu_total,
        cpu_used=hb.cpu_used,
        memory_mb_total=hb.memory_mb_total,
        memory_mb_used=hb.memory_mb_used,
        memory_mb_admittable=hb.memory_mb_admittable,
        memory_admission=hb.memory_admission,
        templates=frozenset(hb.templates) if hb.templates is not None else None,
        runtime=hb.runtime,
        gpu=hb.gpu,
        role=hb.role,
        stream_restore=hb.stream_restore,
        # Warm sandboxes are no record's: they must neither confirm a reservation nor look stray.
        sandbox_ids=hb.owned_ids(),
        address=hb.address,
        warm={t: (c.ready, c.starting) for t, c in hb.warm.items()},
        epochs=dict(hb.epochs),
    )


class HeartbeatIntake:
    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics
        # Host -> the OOM counts it last reported and the store has: a heartbeat repeats them all,
        # only a rise needs a write.
        self._oom_recorded: dict[str, dict[str, int]] = {}

    async def accept(self, hb: WireHeartbeat) -> HeartbeatResult:
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
