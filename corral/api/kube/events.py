"""Kubernetes events (core/v1 ``Event``) for ``kubectl describe``, derived when read from what corral
already records of a sandbox: nothing writes them. Its placement explanation is ``Scheduled``; a warm
sandbox handed to its create is ``SandboxAdopted`` (on the claim too); a failover recreate is
``Recreated`` (counted by its epoch); the OOM kills its host reported are ``OOMKilling``; a state
that needs explaining (host lost, waiting for room, failed, stopped) is an event of its own.

Derived, so bounded by the record: an event's count is what the record counts, and its times are the
record's (a count over the sandbox's life, the last at the record's last write). ``kubectl describe``
lists them with ``/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name=...``; that path
and ``/api/v1/events`` answer lists only (``/api`` is still not discovered: ``kubectl get events``
is not served).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from corral.api.kube import render
from corral.api.kube.access import Namespaces
from corral.api.kube.kinds import CLAIM, SANDBOX, Kind
from corral.api.kube.objects import Objects
from corral.api.kube.select import fields, labels
from corral.api.kube.status import ObjectResponse
from corral.api.schemas import iso
from corral.control.errors import InvalidRequest
from corral.control.explain import expand
from corral.store import SandboxRecord, SandboxState

Obj = dict[str, Any]
NORMAL, WARNING = "Normal", "Warning"
COMPONENT = "corral"

# What an event may be selected on (kubectl describe names the involved object's name, namespace,
# kind and uid).
FIELDS = {
    "involvedObject.name": lambda e: e["involvedObject"]["name"],
    "involvedObject.namespace": lambda e: e["involvedObject"]["namespace"],
    "involvedObject.kind": lambda e: e["involvedObject"]["kind"],
    "involvedObject.uid": lambda e: e["involvedObject"]["uid"],
    "involvedObject.apiVersion": lambda e: e["involvedObject"]["apiVersion"],
    "metadata.name": lambda e: e["metadata"]["name"],
    "metadata.namespace": lambda e: e["metadata"]["namespace"],
    "reason": lambda e: e["reason"],
    "type": lambda e: e["type"],
}


@dataclass(frozen=True, slots=True)
class Happening:
    reason: str
    type: str
    message: str
    last: float
    first: float | None = None  # None: at ``last``
    count: int = 1


def _placed(r: SandboxRecord, placement: str | None) -> Happening | None:
    if placement is None:
        return None
    try:
        doc = json.loads(placement)
    except ValueError:
        return None
    # A create's explanation ends "placed" on its host; a recreate's is written with its reservation,
    # before the start that it does not record: the store's choice is the host.
    attempts = doc.get("attempts") or [{}]
    host = doc.get("host") if doc.get("outcome") == "placed" else attempts[-1].get("store_choice")
    if not host:
        return None
    why = expand(doc).get("why")
    message = f"placed on {host}: {why}" if why else f"placed on {host}"
    return Happening("Scheduled", NORMAL, message, r.recreated_at or r.created_at)


def happenings(r: SandboxRecord, placement: str | None) -> list[Happening]:
    """What the record says happened to the sandbox, oldest first. ``placement``: its stored
    explanation (JSON text; None: none kept, as for a warm sandbox)."""
    out: list[Happening] = []
    if r.warm:
        out.append(
            Happening(
                "SandboxAdopted",
                NORMAL,
                f"took warm sandbox {r.id} of pool {r.template} on {r.host_id}",
                r.created_at,
            )
        )
    if r.state is SandboxState.WAITING_CAPACITY:
        until = f" until {iso(r.wait_until)}" if r.wait_until else ""
        out.append(
            Happening("WaitingForCapacity", NORMAL, f"no host has room: it waits{until}", r.created_at)
        )
    if r.epoch > 0 and r.recreated_at is not None:
        out.append(
            Happening(
                "Recreated",
                WARNING,
                f"its host was lost: started again on {r.host_id} (failover: {r.failover}, epoch {r.epoch})",
                r.recreated_at,
                r.created_at,
                r.epoch,
            )
        )
    placed = _placed(r, placement)
    if placed is not None:
        out.append(placed)
    if r.oom_kills > 0:
        out.append(
            Happening(
                "OOMKilling",
                WARNING,
                f"the kernel's OOM killer killed {r.oom_kills} process(es) in it (limit {r.memory_mb} MiB), "
                "as its host last reported",
                r.updated_at,
                r.created_at,
                r.oom_kills,
            )
        )
    state = {
        SandboxState.ORPHANED: (WARNING, "HostLost", f"its host {r.host_id} was lost (failover: orphan)"),
        SandboxState.RECREATING: (WARNING, "Recreating", f"its host {r.host_id} was lost: waiting for room"),
        SandboxState.FAILED: (WARNING, "Failed", "the sandbox failed"),
        SandboxState.STOPPED: (NORMAL, "Stopped", "the sandbox stopped"),
    }.get(r.state)
    if state is not None:
        out.append(Happening(state[1], state[0], state[2], r.updated_at))
    return out


def event(kind: Kind, obj_meta: Obj, h: Happening, version: int) -> Obj:
    name, ns, uid = obj_meta["name"], obj_meta["namespace"], obj_meta["uid"]
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{name}.{kind.singular}.{h.reason.lower()}",
            "namespace": ns,
            "uid": f"event-{uid}-{h.reason.lower()}",
            "resourceVersion": str(version),
            "creationTimestamp": iso(h.first or h.last),
        },
        "involvedObject": {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "name": name,
            "namespace": ns,
            "uid": uid,
            "resourceVersion": str(version),
        },
        "reason": h.reason,
        "message": h.message,
        "type": h.type,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": "",
        "firstTimestamp": iso(h.first or h.last),
        "lastTimestamp": iso(h.last),
        "count": h.count,
    }


def events_of(r: SandboxRecord, namespace: str, placement: str | None, version: int) -> list[Obj]:
    """The events of the sandbox and, when it is a claim's, of its claim."""
    found = happenings(r, placement)
    out = [event(SANDBOX, render.sandbox(r, namespace, version)["metadata"], h, version) for h in found]
    if render.is_claim(r):
        claim = render.claim(r, namespace, version)["metadata"]
        bound = [h for h in found if h.reason in ("SandboxAdopted", "Scheduled")]
        out += [event(CLAIM, claim, h, version) for h in bound]
    return out


class Events:
    """``version``: the change feed's latest version, read once the caller is known."""

    def __init__(
        self, objects: Objects, namespaces: Namespaces, version: Callable[[], Awaitable[int]]
    ) -> None:
        self.objects = objects
        self.ns = namespaces
        self.version = version

    async def list(self, request: Request) -> Response:
        q = request.query_params
        if q.get("watch") in ("1", "true", "True"):
            raise InvalidRequest("watch", "events are derived from the records as they are read: list them")
        a = await self.ns.access(request, request.path_params.get("namespace"))
        by_field, pinned = fields(q.get("fieldSelector"), FIELDS, "involvedObject.name")
        by_label = labels(q.get("labelSelector"))
        version = await self.version()
        if pinned is not None and a.namespace is not None:
            one = await self.objects.record(a, pinned)
            records = [one] if one is not None else []
        else:
            records = [r async for r in self.objects.records(a)]
        # One read for every record's placement, not one each.
        placements = await self.objects.plane.store.get_placements([r.id for r in records])
        items = []
        for r in records:
            if r.id not in placements:
                continue  # gone since it was read
            ns = await self.ns.name_of(r.tenant_id)
            events = events_of(r, ns, placements[r.id], version)
            items += [e for e in events if by_field(e) and by_label(e)]
        return ObjectResponse(
            {
                "apiVersion": "v1",
                "kind": "EventList",
                "metadata": {"resourceVersion": str(version)},
                "items": items,
            }
        )
