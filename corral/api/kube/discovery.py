"""What kubectl reads before it asks for anything: the groups and their resources (the legacy
discovery lists: aggregated discovery is answered only when the Content-Type says so, and corral
never says so), ``/version``, and an OpenAPI v3 document per group-version (``kubectl explain``
reads its schemas; apply and create validate on the server when its PATCH declares
``fieldValidation``)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from corral import __version__
from corral.api.kube.kinds import GROUPS, KINDS, VERSION, Kind

Obj = dict[str, Any]
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def group_list() -> Obj:
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group(g) for g in GROUPS]}


def group(name: str) -> Obj:
    gv = {"groupVersion": f"{name}/{VERSION}", "version": VERSION}
    return {"kind": "APIGroup", "apiVersion": "v1", "name": name, "versions": [gv], "preferredVersion": gv}


def resources(group_name: str) -> Obj:
    out: list[Obj] = []
    for k in KINDS:
        if k.group != group_name:
            continue
        out.append(
            {
                "name": k.plural,
                "singularName": k.singular,
                "namespaced": True,
                "kind": k.kind,
                "verbs": VERBS,
                "shortNames": list(k.short_names),
                "categories": ["all", "corral"],
            }
        )
        out.append(
            {
                "name": f"{k.plural}/status",
                "singularName": "",
                "namespaced": True,
                "kind": k.kind,
                "verbs": ["get"],
            }
        )
        if k.scale:
            out.append(
                {
                    "name": f"{k.plural}/scale",
                    "singularName": "",
                    "namespaced": True,
                    "group": "autoscaling",
                    "version": "v1",
                    "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }
            )
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{group_name}/{VERSION}",
        "resources": out,
    }


def version() -> Obj:
    return {
        "major": "1",
        "minor": "33",
        "gitVersion": f"v1.33.0+corral-{__version__}",
        "platform": "linux/amd64",
    }


# -- OpenAPI v3 -------------------------------------------------------------------------------------

_S = {"type": "string"}
_I = {"type": "integer"}
_N = {"type": "number"}
_B = {"type": "boolean"}
_REF = {"type": "object", "properties": {"name": _S}}
_MAP = {"type": "object", "additionalProperties": _S}
_CONDITIONS = {
    "type": "array",
    "items": {
        "type": "object",
        "properties": {k: _S for k in ("type", "status", "reason", "message", "lastTransitionTime")}
        | {"observedGeneration": _I},
    },
}

SPECS: dict[str, tuple[Obj, Obj]] = {
    "Sandbox": (
        {
            "sandboxTemplateRef": _REF,
            "memoryMB": _I,
            "cpus": _N,
            "stateful": _B,
            "ttlSeconds": _N,
            "env": _MAP,
            "failover": {"type": "string", "enum": ["orphan", "recreate"]},
            "waitSeconds": _N,
            "diskMB": _I,
            "shutdownTime": _S,
        },
        {
            "phase": _S,
            "id": _S,
            "host": _S,
            "epoch": _I,
            "oomKills": _I,
            "observedGeneration": _I,
            "conditions": _CONDITIONS,
        },
    ),
    "SandboxClaim": (
        {"warmPoolRef": _REF, "env": _MAP, "ttlSeconds": _N, "lifecycle": {"type": "object"}},
        {"sandbox": _REF, "launchType": _S, "observedGeneration": _I, "conditions": _CONDITIONS},
    ),
    "SandboxTemplate": (
        {
            "cpus": _N,
            "memoryMB": _I,
            "stateful": _B,
            "pids": _I,
            "failover": _S,
            "description": _S,
            "image": _S,
            "diskMB": _I,
        },
        {},
    ),
    "SandboxWarmPool": (
        {"replicas": _I, "sandboxTemplateRef": _REF, "maxPerHost": _I},
        {
            "replicas": _I,
            "readyReplicas": _I,
            "startingReplicas": _I,
            "selector": _S,
            "hits": _I,
            "misses": _I,
            "perHost": {"type": "object"},
            "observedGeneration": _I,
            "conditions": _CONDITIONS,
        },
    ),
}


def _schema_name(k: Kind) -> str:
    return f"{k.group}.{VERSION}.{k.kind}"


def _schema(k: Kind) -> Obj:
    spec, status = SPECS[k.kind]
    props: Obj = {
        "apiVersion": {"type": "string", "description": "APIVersion of this object"},
        "kind": {"type": "string", "description": "Kind of this object"},
        "metadata": {"type": "object", "description": "Standard object metadata"},
        "spec": {"type": "object", "description": f"What the {k.kind} asks for", "properties": spec},
    }
    if status:
        props["status"] = {
            "type": "object",
            "description": f"What corral observes of the {k.kind}",
            "properties": status,
        }
    return {
        "type": "object",
        "description": f"{k.kind}: served by corral from its own records",
        "properties": props,
        "x-kubernetes-group-version-kind": [{"group": k.group, "version": VERSION, "kind": k.kind}],
    }


def _op(k: Kind, verb: str, params: list[Obj] | None = None) -> Obj:
    ref = {"$ref": f"#/components/schemas/{_schema_name(k)}"}
    return {
        "operationId": f"{verb}{k.kind}",
        "parameters": params or [],
        "responses": {"200": {"content": {"application/json": {"schema": ref}}}},
        "x-kubernetes-group-version-kind": {"group": k.group, "version": VERSION, "kind": k.kind},
        "x-kubernetes-action": verb,
    }


_FIELD_VALIDATION = {
    "name": "fieldValidation",
    "in": "query",
    "schema": {"type": "string"},
    "uniqueItems": True,
}


def openapi(group_name: str) -> Obj:
    paths: Obj = {}
    schemas: Obj = {}
    for k in KINDS:
        if k.group != group_name:
            continue
        schemas[_schema_name(k)] = _schema(k)
        base = f"/apis/{k.group}/{VERSION}/namespaces/{{namespace}}/{k.plural}"
        paths[base] = {"get": _op(k, "list"), "post": _op(k, "post", [_FIELD_VALIDATION])}
        paths[f"{base}/{{name}}"] = {
            "get": _op(k, "get"),
            "put": _op(k, "put", [_FIELD_VALIDATION]),
            "patch": _op(k, "patch", [_FIELD_VALIDATION]),
            "delete": _op(k, "delete"),
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "corral", "version": __version__},
        "paths": paths,
        "components": {"schemas": schemas},
    }


def _hash(doc: Obj) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()


def openapi_index() -> Obj:
    return {
        "paths": {
            f"apis/{g}/{VERSION}": {
                "serverRelativeURL": f"/openapi/v3/apis/{g}/{VERSION}?hash={_hash(openapi(g))}"
            }
            for g in GROUPS
        }
    }
