"""Rows <-> records: the column lists both backends select, and the conversions from driver tuples.

CPU is stored in integer millicores, so reserved totals add and subtract exactly and an idle fleet
returns to exactly zero.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from corral.core.types import AdmissionMode, HostState
from corral.images.config import ImageConfig
from corral.store.errors import InvalidRecord
from corral.store.records import (
    HostRecord,
    Page,
    PoolRecord,
    ReservationRecord,
    SandboxRecord,
    SandboxState,
    SandboxSummary,
    TemplateRecord,
    TenantRecord,
)

# CPU's conversions live with the records (the quota check needs them); every row reads them here.
from corral.store.records import from_millicores as from_millicores
from corral.store.records import to_millicores as to_millicores

Row = Sequence[Any]

# A sandbox row's CPUs in millicores, in SQL: what ``to_millicores`` makes of its ``cpus`` (creates
# round a request to whole millicores, so the two roundings never differ on a half).
SANDBOX_CPU_M = "CAST(round(cpus * 1000) AS BIGINT)"


def in_list(prefix: str, values: Iterable[Any]) -> tuple[str, dict[str, Any]]:
    """``IN (:p0, :p1, ...)`` and its parameters (the portable spelling of a list parameter)."""
    params = {f"{prefix}{i}": v for i, v in enumerate(values)}
    return "(" + ", ".join(f":{k}" for k in params) + ")", params


# -- hosts -----------------------------------------------------------------------------------------

HOST_COLS = (
    "h.id, h.heartbeat_at, h.cpu_total, h.cpu_used, h.memory_mb_total, h.memory_mb_used, "
    "h.memory_mb_admittable, h.memory_admission, h.templates, h.runtime, h.gpu, h.role, h.state, "
    "h.stream_restore, h.listed_count, h.seq, h.registered_at, h.address, h.listed_seq, h.listed_at"
)

# Hosts with their *live* reserved totals: the stored counters also hold reservations that expired but
# were not swept yet, and an expired reservation must never count against capacity.
HOSTS_SELECT = f"""
SELECT {HOST_COLS},
       h.reserved_mb - coalesce(x.mb, 0), h.reserved_cpu_m - coalesce(x.cpu_m, 0), h.warm, h.images
FROM hosts h
LEFT JOIN (
    SELECT host_id, CAST(sum(memory_mb) AS BIGINT) AS mb, CAST(sum(cpu_m) AS BIGINT) AS cpu_m
    FROM reservations WHERE expires_at <= :now {{scope}} GROUP BY host_id
) x ON x.host_id = h.id
"""


def host_from_row(r: Row) -> HostRecord:
    templates = json.loads(r[8]) if r[8] is not None else None
    return HostRecord(
        id=r[0],
        heartbeat_at=float(r[1]),
        cpu_total=float(r[2]),
        cpu_used=float(r[3]),
        memory_mb_total=int(r[4]),
        memory_mb_used=int(r[5]),
        memory_mb_admittable=int(r[6]),
        memory_admission=AdmissionMode(r[7]),
        templates=frozenset(templates) if templates is not None else None,
        runtime=r[9],
        gpu=r[10],
        role=r[11],
        state=HostState(r[12]),
        stream_restore=bool(r[13]),
        sandbox_count=int(r[14]),
        seq=int(r[15]),
        registered_at=float(r[16]),
        address=r[17],
        listed_seq=None if r[18] is None else int(r[18]),
        listed_at=float(r[19]),
        reserved_mb=int(r[20]),
        reserved_cpu=from_millicores(int(r[21])),
        warm=warm_from_json(r[22]),
        images=frozenset(json.loads(r[23] or "[]")),
    )


def warm_to_json(warm: Mapping[str, tuple[int, int]]) -> str:
    return json.dumps({t: [int(n[0]), int(n[1])] for t, n in sorted(warm.items())})


def warm_from_json(text: str | None) -> dict[str, tuple[int, int]]:
    return {t: (int(n[0]), int(n[1])) for t, n in json.loads(text or "{}").items()}


def json_list(values: frozenset[str] | None) -> str | None:
    return None if values is None else json.dumps(sorted(values))


# -- reservations ----------------------------------------------------------------------------------

RESERVATION_COLS = "id, host_id, memory_mb, cpu_m, owner, sandbox_id, created_at, expires_at"


def reservation_from_row(r: Row) -> ReservationRecord:
    return ReservationRecord(
        id=r[0],
        host_id=r[1],
        memory_mb=int(r[2]),
        cpu=from_millicores(int(r[3])),
        owner=r[4],
        sandbox_id=r[5],
        created_at=float(r[6]),
        expires_at=float(r[7]),
    )


# -- sandboxes -------------------------------------------------------------------------------------

SANDBOX_COLS = (
    "id, tenant_id, name, template, host_id, state, memory_mb, cpus, stateful, metadata, "
    "created_at, updated_at, expires_at, reservation_id, version, oom_kills, warm, failover, epoch, recreated_at, "
    "wait_until, owner, image, disk_mb, network, lifecycle, paused"
)


# A state by its stored text: a dict read, where calling the enum costs a list of 10,000 rows 20 ms.
_STATES = {s.value: s for s in SandboxState}


def sandbox_from_row(r: Row) -> SandboxRecord:
    return SandboxRecord(
        id=r[0],
        tenant_id=r[1],
        name=r[2],
        template=r[3],
        host_id=r[4],
        state=_STATES[r[5]],
        memory_mb=int(r[6]),
        cpus=float(r[7]),
        stateful=bool(r[8]),
        metadata=json.loads(r[9]),
        created_at=float(r[10]),
        updated_at=float(r[11]),
        expires_at=float(r[12]) if r[12] is not None else None,
        reservation_id=r[13],
        version=int(r[14]),
        oom_kills=int(r[15]),
        warm=bool(r[16]),
        failover=r[17],
        epoch=int(r[18]),
        recreated_at=float(r[19]) if r[19] is not None else None,
        wait_until=float(r[20]) if r[20] is not None else None,
        owner=r[21],
        image=r[22],
        disk_mb=int(r[23]) if r[23] is not None else None,
        network=r[24],
        lifecycle=r[25],
        paused=r[26],
    )


SUMMARY_COLS = "id, tenant_id, name, template, host_id, state, metadata, created_at, warm"


def summary_from_row(r: Row) -> SandboxSummary:
    return SandboxSummary(
        r[0], r[1], r[2], r[3], r[4], _STATES[r[5]], orjson.loads(r[6]), float(r[7]), bool(r[8])
    )


def sandbox_to_json(rec: SandboxRecord) -> str:
    """The first result of an idempotent create, kept so a replay can answer even after a delete."""
    return json.dumps(
        {
            "id": rec.id,
            "tenant_id": rec.tenant_id,
            "name": rec.name,
            "template": rec.template,
            "host_id": rec.host_id,
            "state": rec.state.value,
            "memory_mb": rec.memory_mb,
            "cpus": rec.cpus,
            "stateful": rec.stateful,
            "metadata": dict(rec.metadata),
            "created_at": rec.created_at,
            "updated_at": rec.updated_at,
            "expires_at": rec.expires_at,
            "reservation_id": rec.reservation_id,
            "version": rec.version,
            "warm": rec.warm,
            "failover": rec.failover,
            "epoch": rec.epoch,
            "recreated_at": rec.recreated_at,
            "wait_until": rec.wait_until,
            "owner": rec.owner,
            "image": rec.image,
            "disk_mb": rec.disk_mb,
            "network": rec.network,
            "lifecycle": rec.lifecycle,
            "paused": rec.paused,
        }
    )


def sandbox_from_json(text: str) -> SandboxRecord:
    d = json.loads(text)
    d["state"] = SandboxState(d["state"])
    return SandboxRecord(**d)


# -- tenants, templates ----------------------------------------------------------------------------

TENANT_COLS = "id, name, max_sandboxes, max_memory_mb, created_at, max_cpu_m, create_rate, create_burst"


def tenant_from_row(r: Row) -> TenantRecord:
    return TenantRecord(
        id=r[0],
        name=r[1],
        max_sandboxes=int(r[2]),
        max_memory_mb=int(r[3]),
        created_at=float(r[4]),
        max_cpus=from_millicores(int(r[5])),
        create_rate_per_s=None if r[6] is None else float(r[6]),
        create_burst=None if r[7] is None else int(r[7]),
    )


TEMPLATE_COLS = "name, cpus, memory_mb, stateful, runtime, description, created_at, pids, failover, image, image_config, disk_mb, version"


def template_from_row(r: Row) -> TemplateRecord:
    return TemplateRecord(
        name=r[0],
        cpus=float(r[1]),
        memory_mb=int(r[2]),
        stateful=bool(r[3]),
        runtime=r[4],
        description=r[5],
        created_at=float(r[6]),
        pids=int(r[7]),
        failover=r[8],
        image=r[9],
        image_config=ImageConfig.from_json(json.loads(r[10])) if r[10] is not None else None,
        disk_mb=int(r[11]) if r[11] is not None else None,
        version=int(r[12]),
    )


def image_config_text(config: ImageConfig | None) -> str | None:
    return json.dumps(config.to_json(), sort_keys=True) if config is not None else None


POOL_COLS = "template, size, max_per_host, created_at, updated_at"


def pool_from_row(r: Row, targets: Mapping[str, int]) -> PoolRecord:
    return PoolRecord(
        template=r[0],
        size=int(r[1]),
        max_per_host=int(r[2]) if r[2] is not None else None,
        targets=dict(targets),
        created_at=float(r[3]),
        updated_at=float(r[4]),
    )


# -- pagination ------------------------------------------------------------------------------------


def encode_cursor(created_at: float, sandbox_id: str) -> str:
    raw = json.dumps([created_at, sandbox_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def page_of(got: list[SandboxRecord], limit: int) -> Page:
    """A page of ``got`` (read with one more than ``limit``, to know whether another page follows)."""
    if len(got) <= limit:
        return Page(got, None)
    last = got[limit - 1]
    return Page(got[:limit], encode_cursor(last.created_at, last.id))


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, sandbox_id = json.loads(raw)
        if not isinstance(sandbox_id, str) or isinstance(created_at, bool):
            raise ValueError("bad cursor fields")
        return float(created_at), sandbox_id
    except (ValueError, TypeError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidRecord(f"cursor: not a cursor this store issued ({cursor!r})") from exc
