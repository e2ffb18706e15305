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
        sandbox_ids=frozenset(hb.sandbox_ids),
        address=hb.address,
    )


class HeartbeatIntake:
    def __init__(self, store: Store, metrics: Metrics) -> None:
        self.store = store
        self.metrics = metrics

    async def accept(self, hb: WireHeartbeat) -> HeartbeatResult:
        result = await self.store.upsert_heartbeat(to_store(hb))
        self.metrics.heartbeats.labels("true" if result.accepted else "false").inc()
        if result.accepted and hb.oom_kills:
            await self.store.record_oom_kills(hb.agent_id, hb.oom_kills)
        return result
