"""corral's records as Kubernetes objects of the four kinds, and each object's row of cells for
``kubectl get``: one translation, read by get, list, watch and the Table."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Protocol

from corral.api.kube.kinds import CLAIM, CLAIM_POOL, LAUNCH_TYPE, POOL, SANDBOX, TEMPLATE, Kind
from corral.api.schemas import iso
from corral.control.pools import PoolStatus
from corral.store import SandboxRecord, SandboxState, TemplateRecord

Obj = dict[str, Any]


class Listed(Protocol):
    """What a sandbox's metadata and row are made of: a whole record, or the summary a list reads
    (:class:`corral.store.SandboxSummary`)."""

    @property
    def id(self) -> str: ...
    @property
    def name(self) -> str | None: ...
    @property
    def template(self) -> str: ...
    @property
    def host_id(self) -> str | None: ...
    @property
    def state(self) -> SandboxState: ...
    @property
    def metadata(self) -> Mapping[str, str]: ...
    @property
    def created_at(self) -> float: ...
    @property
    def warm(self) -> bool: ...


# corral's state of a sandbox -> (Ready, its reason).
_READY: dict[SandboxState, tuple[bool, str]] = {
    SandboxState.RUNNING: (True, "DependenciesReady"),
    SandboxState.RESERVED: (False, "Starting"),
    SandboxState.STARTING: (False, "Starting"),
    SandboxState.WAITING_CAPACITY: (False, "WaitingForCapacity"),
    SandboxState.RECREATING: (False, "Recreating"),
    SandboxState.ORPHANED: (False, "HostLost"),
    SandboxState.FAILED: (False, "Failed"),
    SandboxState.STOPPED: (False, "SandboxExpired"),
    SandboxState.DELETED: (False, "Deleting"),
}
_FINISHED = {SandboxState.STOPPED, SandboxState.FAILED, SandboxState.DELETED}


def name_of(r: Listed) -> str:
    """A sandbox's Kubernetes name: its own name, else its id (ids are unique, names among the live)."""
    return r.name or r.id


def is_claim(r: Listed) -> bool:
    return CLAIM_POOL in r.metadata


def _meta(name: str, namespace: str, uid: str, created: float, version: int, **more: Any) -> Obj:
    meta: Obj = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "resourceVersion": str(version),
        "generation": 1,
        "creationTimestamp": iso(created) if created else None,
    }
    meta.update({k: v for k, v in more.items() if v})
    return meta


def _condition(kind: str, ok: bool, reason: str, message: str, at: str | None) -> Obj:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": at,
        "observedGeneration": 1,
    }


def ready_of(r: Listed) -> tuple[bool, str]:
    got = _READY.get(r.state)
    return got if got is not None else (False, r.state.value)


def _conditions(r: SandboxRecord) -> list[Obj]:
    ok, reason = ready_of(r)
    finished = r.state in _FINISHED
    at = iso(r.updated_at)
    return [
        _condition("Ready", ok, reason, f"the sandbox is {r.state.value}", at),
        _condition("Suspended", False, "NotSuspended", "", at),
        _condition("Finished", finished, reason if finished else "Running", "", at),
    ]


def _labels(r: Listed) -> dict[str, str]:
    labels = {k: v for k, v in r.metadata.items() if k != CLAIM_POOL}
    labels[LAUNCH_TYPE] = "warm" if r.warm else "cold"
    return labels


def sandbox_meta(kind: Kind, r: Listed, namespace: str, version: int) -> Obj:
    """A Sandbox's or SandboxClaim's metadata: the whole object's, and a Table row's (built
    without :func:`_meta`'s keywords: a list renders 10,000 of them)."""
    name = name_of(r)
    meta = _meta(name, namespace, f"claim-{r.id}" if kind is CLAIM else r.id, r.created_at, version)
    meta["labels"] = _labels(r)
    if kind is not CLAIM and is_claim(r):
        owner = {"apiVersion": CLAIM.api_version, "kind": CLAIM.kind, "name": name, "uid": f"claim-{r.id}"}
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return meta


def sandbox(r: SandboxRecord, namespace: str, version: int) -> Obj:
    spec: Obj = {
        "sandboxTemplateRef": {"name": r.template},
        "memoryMB": r.memory_mb,
        "cpus": r.cpus,
        "stateful": r.stateful,
        "failover": r.failover,
    }
    if r.expires_at is not None:
        spec["shutdownTime"] = iso(r.expires_at)
    return {
        "apiVersion": SANDBOX.api_version,
        "kind": SANDBOX.kind,
        "metadata": sandbox_meta(SANDBOX, r, namespace, version),
        "spec": spec,
        "status": {
            "phase": r.state.value,
            "id": r.id,
            "host": r.host_id,
            "epoch": r.epoch,
            "oomKills": r.oom_kills,
            "observedGeneration": 1,
            "conditions": _conditions(r),
        },
    }


def claim(r: SandboxRecord, namespace: str, version: int) -> Obj:
    ok, reason = ready_of(r)
    return {
        "apiVersion": CLAIM.api_version,
        "kind": CLAIM.kind,
        "metadata": sandbox_meta(CLAIM, r, namespace, version),
        "spec": {"warmPoolRef": {"name": r.metadata[CLAIM_POOL]}},
        "status": {
            "sandbox": {"name": name_of(r)},
            "launchType": "warm" if r.warm else "cold",
            "observedGeneration": 1,
            "conditions": [
                _condition("Ready", ok, reason, f"the sandbox is {r.state.value}", iso(r.updated_at))
            ],
        },
    }


def template(t: TemplateRecord, namespace: str, version: int) -> Obj:
    spec: Obj = {
        "cpus": t.cpus,
        "memoryMB": t.memory_mb,
        "stateful": t.stateful,
        "pids": t.pids,
        "failover": t.failover,
        "description": t.description,
    }
    if t.image is not None:
        spec["image"] = t.image
    if t.disk_mb is not None:
        spec["diskMB"] = t.disk_mb
    return {
        "apiVersion": TEMPLATE.api_version,
        "kind": TEMPLATE.kind,
        "metadata": _meta(t.name, namespace, f"template-{t.name}", t.created_at, version),
        "spec": spec,
    }


def pool(s: PoolStatus, namespace: str, version: int) -> Obj:
    p = s.pool
    spec: Obj = {"replicas": p.size, "sandboxTemplateRef": {"name": p.template}}
    if p.max_per_host is not None:
        spec["maxPerHost"] = p.max_per_host
    ready = s.ready >= p.size
    return {
        "apiVersion": POOL.api_version,
        "kind": POOL.kind,
        "metadata": _meta(p.template, namespace, f"pool-{p.template}", p.created_at, version),
        "spec": spec,
        "status": {
            "replicas": s.ready + s.starting,
            "readyReplicas": s.ready,
            "startingReplicas": s.starting,
            "selector": f"{CLAIM_POOL}={p.template}",
            "hits": s.hits,
            "misses": s.misses,
            "perHost": {
                h: {"target": x.target, "ready": x.ready, "starting": x.starting}
                for h, x in s.per_host.items()
            },
            "observedGeneration": 1,
            "conditions": [
                _condition(
                    "Ready",
                    ready,
                    "PoolReady" if ready else "Replenishing",
                    f"{s.ready} of {p.size} ready",
                    iso(p.updated_at),
                )
            ],
        },
    }


def age(created: str | None, now: float) -> str:
    """Kubernetes' short human duration (``45s``, ``3m12s``, ``5h``, ``12d``)."""
    if not created:
        return "<unknown>"
    return age_of(datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp(), now)


def age_of(created: float, now: float) -> str:
    s = max(0, int(now - created))
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 48:
        return f"{h}h"
    return f"{h // 24}d"


def sandbox_cells(kind: Kind, r: Listed, now: float) -> list[Any]:
    """A Sandbox's or SandboxClaim's row, in :attr:`Kind.columns` order, from its record."""
    ok, reason = ready_of(r)
    name, ready, age_ = (
        name_of(r),
        "True" if ok else "False",
        age_of(r.created_at, now) if r.created_at else "<unknown>",
    )
    if kind is SANDBOX:
        return [name, ready, reason, age_, r.state.value, r.host_id or "", r.template]
    return [name, ready, name, reason, age_, "warm" if r.warm else "cold"]


def gone_cells(kind: Kind, gone: Obj) -> list[Any]:
    """The row of an object that is gone (a watch's DELETED event): its name, nothing else known."""
    return [gone["metadata"]["name"]] + [""] * (len(kind.columns) - 1)


def cells(kind: Kind, obj: Obj, now: float) -> list[Any]:
    """A template's or pool's row, in :attr:`Kind.columns` order."""
    meta, status, spec = obj["metadata"], obj.get("status", {}), obj.get("spec", {})
    age_ = age(meta.get("creationTimestamp"), now)
    if kind is TEMPLATE:
        return [meta["name"], spec["cpus"], spec["memoryMB"], age_]
    return [meta["name"], status["readyReplicas"], spec["replicas"], age_, status["startingReplicas"]]
