"""corral's records as Kubernetes objects of the four kinds, and each object's row of cells for
``kubectl get``: one translation, read by get, list, watch and the Table."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from corral.api.kube.kinds import CLAIM, CLAIM_POOL, LAUNCH_TYPE, POOL, SANDBOX, TEMPLATE, Kind
from corral.api.schemas import iso
from corral.control.pools import PoolStatus
from corral.store import SandboxRecord, SandboxState, TemplateRecord

Obj = dict[str, Any]

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


def name_of(r: SandboxRecord) -> str:
    """A sandbox's Kubernetes name: its own name, else its id (ids are unique, names among the live)."""
    return r.name or r.id


def is_claim(r: SandboxRecord) -> bool:
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


def ready_of(r: SandboxRecord) -> tuple[bool, str]:
    return _READY.get(r.state, (False, r.state.value))


def _conditions(r: SandboxRecord) -> list[Obj]:
    ok, reason = ready_of(r)
    finished = r.state in _FINISHED
    at = iso(r.updated_at)
    return [
        _condition("Ready", ok, reason, f"the sandbox is {r.state.value}", at),
        _condition("Suspended", False, "NotSuspended", "", at),
        _condition("Finished", finished, reason if finished else "Running", "", at),
    ]


def _labels(r: SandboxRecord) -> dict[str, str]:
    labels = {k: v for k, v in r.metadata.items() if k != CLAIM_POOL}
    labels[LAUNCH_TYPE] = "warm" if r.warm else "cold"
    return labels


def sandbox(r: SandboxRecord, namespace: str, version: int) -> Obj:
    owners = []
    if is_claim(r):
        owners.append(
            {
                "apiVersion": CLAIM.api_version,
                "kind": CLAIM.kind,
                "name": name_of(r),
                "uid": f"claim-{r.id}",
                "controller": True,
            }
        )
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
        "metadata": _meta(
            name_of(r), namespace, r.id, r.created_at, version, labels=_labels(r), ownerReferences=owners
        ),
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
        "metadata": _meta(name_of(r), namespace, f"claim-{r.id}", r.created_at, version, labels=_labels(r)),
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
    s = max(0, int(now - datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()))
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


def cells(kind: Kind, obj: Obj, now: float) -> list[Any]:
    """The row ``kubectl get`` prints, in :attr:`Kind.columns` order."""
    meta, status, spec = obj["metadata"], obj.get("status", {}), obj.get("spec", {})
    age_ = age(meta.get("creationTimestamp"), now)
    if kind is SANDBOX or kind is CLAIM:
        ready = status["conditions"][0]
        if kind is SANDBOX:
            return [
                meta["name"],
                ready["status"],
                ready["reason"],
                age_,
                status["phase"],
                status["host"] or "",
                spec["sandboxTemplateRef"]["name"],
            ]
        return [
            meta["name"],
            ready["status"],
            status["sandbox"]["name"],
            ready["reason"],
            age_,
            status["launchType"],
        ]
    if kind is TEMPLATE:
        return [meta["name"], spec["cpus"], spec["memoryMB"], age_]
    return [meta["name"], status["readyReplicas"], spec["replicas"], age_, status["startingReplicas"]]
