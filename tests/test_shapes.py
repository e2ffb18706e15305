"""Every shape the server and the SDK exchange is declared once (:mod:`corral.shapes`): no class of the
server's and none of the SDK's has (nearly) the fields of a class on another side. Shapes are compared by
their field names, so a copy that has drifted by a field or two is found as well as an exact one."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import corral
from corral.agent.protocol import EgressPolicyBody, StartSandbox
from corral.api.pools import PoolBody
from corral.api.schemas import MAX_CPUS, MAX_MEMORY_MB, MAX_TTL_S, SandboxSpecBody, sandbox_json
from corral.client.models import Host, SandboxRecord
from corral.client.retry import RetryPolicy
from corral.control.create import CreateSpec
from corral.control.network import checked, network_text
from corral.control.seal import Spec
from corral.core.types import (
    DEFAULT_CPUS,
    DEFAULT_SANDBOX_PIDS,
    DEFAULT_TEMPLATE,
    MAX_SANDBOX_PIDS,
    MIN_SANDBOX_PIDS,
    CreateRequest,
)
from corral.ids import new_sandbox_id
from corral.images import digest_file
from corral.images.config import ImageConfig
from corral.runtime.base import SandboxSpec
from corral.shapes.hosts import Host as SharedHost
from corral.shapes.sandboxes import SandboxRecord as SharedSandboxRecord
from corral.shapes.tokens import TokenInfo
from corral.store.records import SandboxRecord as StoreSandboxRecord
from corral.store.records import SandboxState, TemplateRecord, TokenRecord
from tests.control.conftest import ADMIN, make_cluster

# What both import (tests/test_layers.py holds them to importing nothing else of corral).
SHARED = ("shapes", "exec_result", "codes")
# Two shapes are one when this share of their fields' names is common to both (a shape renamed on
# one side, or one that gained a field the other never learnt, is still the same shape); records and
# the answers made of them share less (a store's ``tenant_id`` is the answer's ``tenant``).
SAME_SHAPE = 0.8


def fields_of(cls: type) -> frozenset[str] | None:
    if issubclass(cls, BaseModel):
        return frozenset(cls.model_fields)
    if dataclasses.is_dataclass(cls):
        return frozenset(f.name for f in dataclasses.fields(cls))
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return frozenset(cls._fields)
    return None


def side(module: str) -> str:
    part = module.split(".")[1] if "." in module else ""
    return "shared" if part in SHARED else "sdk" if part == "client" else "server"


def shapes() -> Iterator[tuple[str, str, frozenset[str]]]:
    """(side, dotted name, field names) of every class with fields the package declares."""
    for info in pkgutil.walk_packages(corral.__path__, "corral."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, type) and value.__module__ == info.name:
                names = fields_of(value)
                if names:
                    yield side(info.name), f"{info.name}.{value.__qualname__}", names


def similarity(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b)


def test_no_shape_is_declared_on_two_sides() -> None:
    found = list(shapes())
    twice = [
        f"{a} ~ {b}: {sorted(fa ^ fb) or 'the same fields'}"
        for i, (sa, a, fa) in enumerate(found)
        for sb, b, fb in found[i + 1 :]
        if sa != sb and similarity(fa, fb) >= SAME_SHAPE
    ]
    assert not twice, "declare it once in corral.shapes and import it on both sides:\n" + "\n".join(twice)


def test_every_side_is_seen() -> None:
    """The comparison above is not empty: each side's classes are found, with their fields."""
    found = {name: (where, names) for where, name, names in shapes()}
    for cls, where in [
        (SandboxSpecBody, "server"),
        (PoolBody, "server"),
        (TokenRecord, "server"),
        (RetryPolicy, "sdk"),
        (SharedHost, "shared"),
        (SharedSandboxRecord, "shared"),
    ]:
        got = found[f"{cls.__module__}.{cls.__qualname__}"]
        assert got == (where, fields_of(cls)), cls


def test_a_drifted_copy_counts_as_the_same_shape() -> None:
    copy = frozenset(SharedHost.model_fields) - {"address", "runtime"}
    assert similarity(copy, frozenset(SharedHost.model_fields)) >= SAME_SHAPE
    # A record and the answer made of it are different shapes.
    assert similarity(fields_of(TokenRecord) or frozenset(), frozenset(TokenInfo.model_fields)) < SAME_SHAPE


def test_the_sdk_hands_out_the_shared_shapes() -> None:
    assert Host is SharedHost and SandboxRecord is SharedSandboxRecord


def test_the_hot_routes_answer_is_the_shape_field_for_field() -> None:
    """The hot routes answer with ``sandbox_json`` without a validation pass: its keys are the shape's
    fields, and the SDK reads back every value as the server wrote it (oom kills and times included)."""
    record = StoreSandboxRecord(
        id="sb-1",
        tenant_id="tn-1",
        template="default",
        memory_mb=512,
        cpus=1.5,
        name="web",
        host_id="h0",
        state=SandboxState.RUNNING,
        metadata={"a": "b"},
        created_at=1_764_558_716.25,
        expires_at=1_764_558_776.0,
        oom_kills=2,
        warm=True,
        epoch=3,
        recreated_at=1_764_558_720.5,
    )
    sent = sandbox_json(record)
    assert set(sent) == set(SharedSandboxRecord.model_fields)
    read = SharedSandboxRecord.model_validate(sent)
    assert read.model_dump(mode="json") == sent
    assert read.oom_kills == 2 and read.tenant == "tn-1" and read.state == "running"


# -- the sandbox's shape on its way down ----------------------------------------------------------
# The body a client sends becomes the create's spec, the spec the record, the record what placement
# weighs and what its host is asked to start, and that start what the runtime runs. Each hop is one
# function beside its shape; each table below says, for one hop, where every field of the shape it
# reads arrives (``passes``), or why it goes no further on that path (``stops``), and where every
# field of the shape it makes that is not passed comes from (``fills``). A field added to a shape and
# not placed here fails the first test; placed here and forgotten by its hop, the second.


@dataclasses.dataclass(frozen=True)
class Hop:
    src: type
    dst: type
    passes: dict[str, str]
    stops: dict[str, str] = dataclasses.field(default_factory=dict)
    fills: dict[str, str] = dataclasses.field(default_factory=dict)


BODY_TO_SPEC = Hop(  # SandboxSpecBody.create_spec
    SandboxSpecBody,
    CreateSpec,
    passes={f: f for f in CreateSpec.__dataclass_fields__ if f != "lifecycle"},
    fills={"lifecycle": "E2B's create (api/e2b/control.py): corral's own body has none yet"},
)
# What a record gets after it is first written.
_LATER = (
    "state",
    "host_id",
    "created_at",
    "updated_at",
    "reservation_id",
    "version",
    "oom_kills",
    "warm",
    "recreated_at",
    "wait_until",
    "paused",
)
SPEC_TO_RECORD = Hop(  # CreateSpec.record
    CreateSpec,
    StoreSandboxRecord,
    passes={
        "template": "template",
        "memory_mb": "memory_mb",  # these four: the template's where the spec leaves them out
        "cpus": "cpus",
        "stateful": "stateful",
        "failover": "failover",
        "disk_mb": "disk_mb",  # for an image's sandbox: the template's, else the default
        "network": "network",  # checked, in its canonical text (None: mode none)
        "lifecycle": "lifecycle",
        "ttl_seconds": "expires_at",
        "name": "name",
        "metadata": "metadata",
    },
    stops={
        "env": "sealed into the record (CreateSpec.contents), and started with (Start.of)",
        "secrets": "sealed into the record (CreateSpec.contents), and started with (Start.of)",
        "wait_s": "parked with it (WaitingCreates.park writes wait_until)",
    },
    fills={
        "id": "a new sandbox id",
        "tenant_id": "the caller's tenant",
        "owner": "the replica writing it",
        "sealed_spec": "CreateSpec.contents, sealed",
        "image": "the template's image",
        **dict.fromkeys((*_LATER, "epoch"), "the store, placement, failover or a heartbeat, later"),
    },
)
# What the record holds for the control plane alone: neither weighed by placement nor asked of a host.
_RECORD_ONLY = (
    "id",
    "tenant_id",
    "name",
    "metadata",
    "expires_at",
    "failover",
    "sealed_spec",
    "owner",
    "lifecycle",
    *_LATER,
)
RECORD_TO_REQUEST = Hop(  # SandboxRecord.request
    StoreSandboxRecord,
    CreateRequest,
    passes={"memory_mb": "memory_mb", "cpus": "cpu", "stateful": "stateful", "image": "image"},
    stops={
        **dict.fromkeys(_RECORD_ONLY, "not weighed by placement"),
        "template": "not weighed yet: a host without it refuses the start, tried elsewhere",
        "epoch": "not weighed by placement",
        "disk_mb": "not weighed by placement: a host's disks are not yet a dimension",
        "network": "not weighed by placement: every host with the process runtime has slots",
    },
    fills=dict.fromkeys(("template", "runtime", "gpu", "tenant"), "not asked of the host's filters yet"),
)
RECORD_TO_START = Hop(  # StartSandbox.of
    StoreSandboxRecord,
    StartSandbox,
    passes={
        "id": "id",
        "memory_mb": "memory_mb",
        "cpus": "cpus",
        "stateful": "stateful",
        "template": "template",
        "epoch": "epoch",
        "image": "image",
        "disk_mb": "disk_mb",
        "network": "egress",
    },
    stops=dict.fromkeys(set(_RECORD_ONLY) - {"id"}, "the control plane's, not the host's"),
    fills={
        "user": "the image's config",
        "workdir": "the image's config",
        "env": "the unsealed spec",
        "secrets": "the unsealed spec",
        "pids": "the template's limit",
        "hostname": "not asked by the control plane: the sandbox's id",
        "network": "not asked by the control plane: loopback only",
        "leased": "from the record's failover: a recreate-policy copy runs under its host's run lease",
    },
)
START_TO_RUNTIME = Hop(  # StartSandbox.spec
    StartSandbox,
    SandboxSpec,
    passes={f: f for f in SandboxSpec.__dataclass_fields__ if f not in ("netns", "nameserver")},
    stops={
        "secrets": "held by the agent, in memory only: given to each exec, never to the runtime",
        "egress": "enforced by the agent: the slot it takes for it is the runtime's netns",
    },
    fills={
        "netns": "the agent's network slot (Agent._start_attached), for an egress that needs one",
        "nameserver": "the slot's resolver (corral.agent.dns), beside its netns",
    },
)
HOPS = (BODY_TO_SPEC, SPEC_TO_RECORD, RECORD_TO_REQUEST, RECORD_TO_START, START_TO_RUNTIME)


@pytest.mark.parametrize("hop", HOPS, ids=lambda h: f"{h.src.__name__}->{h.dst.__name__}")
def test_every_field_of_every_hop_is_accounted_for(hop: Hop) -> None:
    src, dst = fields_of(hop.src) or frozenset(), fields_of(hop.dst) or frozenset()
    assert not set(hop.passes) & set(hop.stops), "a field either passes or stops"
    assert set(hop.passes) | set(hop.stops) == src, "say where each of these goes: " + str(
        sorted(src ^ (set(hop.passes) | set(hop.stops)))
    )
    assert set(hop.passes.values()) | set(hop.fills) == dst, "say where each of these comes from: " + str(
        sorted(dst ^ (set(hop.passes.values()) | set(hop.fills)))
    )


_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)
_env = st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,11}", fullmatch=True), _text, max_size=4)
bodies = st.builds(
    SandboxSpecBody,
    template=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,15}", fullmatch=True),
    memory_mb=st.none() | st.integers(1, MAX_MEMORY_MB),
    cpus=st.none() | st.floats(0.001, MAX_CPUS),
    stateful=st.none() | st.booleans(),
    ttl_seconds=st.none() | st.floats(0.001, MAX_TTL_S),
    name=st.none() | st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True),
    metadata=st.dictionaries(
        st.text(st.characters(blacklist_characters="\x00"), min_size=1, max_size=8), _text, max_size=4
    ),
    env=_env,
    secrets=_env,
    failover=st.none() | st.sampled_from(["recreate", "orphan"]),
    wait_s=st.none() | st.floats(0.001, 3600),
    network=st.none()
    | st.sampled_from([EgressPolicyBody(), EgressPolicyBody(mode="internet", deny_out=["0.0.0.0/0"])]),
)
# What the template gives a spec that leaves a size out (CreateFlow resolves it so before the record).
TEMPLATE = {"memory_mb": 512, "cpus": 1.0, "stateful": False, "failover": "orphan", "disk_mb": 1024}
IMAGE = "sha256:" + "ab" * 32
IMAGE_CONFIG = ImageConfig(user="builder", workdir="/srv")


def arrived(hop: Hop, before: object, after: object, expect: dict[str, object] | None = None) -> None:
    """Each field ``hop`` passes has arrived in ``after`` as it was in ``before`` (or as ``expect`` says)."""
    for src, dst in hop.passes.items():
        want = (expect or {}).get(src, getattr(before, src))
        assert getattr(after, dst) == want, f"{hop.src.__name__}.{src} -> {hop.dst.__name__}.{dst}"


@settings(max_examples=200, deadline=None)
@given(
    body=bodies,
    now=st.floats(0, 2e9),
    epoch=st.integers(0, 2**31),
    pids=st.none() | st.integers(MIN_SANDBOX_PIDS, MAX_SANDBOX_PIDS),
)
def test_a_body_s_fields_arrive_at_every_hop(
    body: SandboxSpecBody, now: float, epoch: int, pids: int | None
) -> None:
    spec = body.create_spec()
    arrived(BODY_TO_SPEC, body, spec, {"network": body.network.wire() if body.network else None})

    resolved = {k: v if (v := getattr(spec, k)) is not None else TEMPLATE[k] for k in TEMPLATE}
    net = network_text(checked(spec.network))
    record = spec.record(
        new_sandbox_id(now), "tn-1", **resolved, now=now, owner="replica-1", image=IMAGE, network=net
    )  # type: ignore[arg-type]
    expires = now + spec.ttl_seconds if spec.ttl_seconds else None
    arrived(SPEC_TO_RECORD, spec, record, {**resolved, "ttl_seconds": expires, "network": net})
    assert (record.tenant_id, record.owner, record.state) == ("tn-1", "replica-1", SandboxState.RESERVED)
    assert spec.contents() == Spec(env=body.env, secrets=body.secrets)

    arrived(RECORD_TO_REQUEST, record, record.request())

    record = dataclasses.replace(record, epoch=epoch)  # as a recreate leaves it
    contents = spec.contents()
    start = StartSandbox.of(record, contents.env, contents.secrets, pids, IMAGE_CONFIG)
    egress = None if net is None else EgressPolicyBody.model_validate_json(net)
    arrived(RECORD_TO_START, record, start, {"network": egress})
    assert (start.env, start.secrets, start.pids) == (body.env, body.secrets, pids)
    assert (start.user, start.workdir) == (IMAGE_CONFIG.user, IMAGE_CONFIG.workdir)
    # What the control plane sends, the agent reads back the same.
    assert StartSandbox.model_validate_json(start.model_dump_json()) == start

    runtime = start.spec()
    arrived(START_TO_RUNTIME, start, runtime, {"pids": DEFAULT_SANDBOX_PIDS if pids is None else pids})


def test_every_shape_defaults_alike() -> None:
    """One set of defaults, declared in corral.core.types: a body, a spec and a runtime's spec that name
    no template run the default one; a request, a start and a runtime's spec that name no CPU share take
    one CPU. The wire's start may leave its template out (no host refuses it for its template list):
    its runtime then starts the default template, as for a start that names it."""
    assert SandboxSpecBody().template == CreateSpec().template == DEFAULT_TEMPLATE
    assert SandboxSpec(id="sb-1", memory_mb=1).template == DEFAULT_TEMPLATE
    bare = StartSandbox(id="sb-1", memory_mb=1)
    assert bare.template is None
    assert bare.spec() == StartSandbox(id="sb-1", memory_mb=1, template=DEFAULT_TEMPLATE).spec()
    assert bare.spec().template == DEFAULT_TEMPLATE and bare.spec().pids == DEFAULT_SANDBOX_PIDS
    assert (
        CreateRequest(memory_mb=1).cpu
        == bare.cpus
        == SandboxSpec(id="sb-1", memory_mb=1).cpus
        == DEFAULT_CPUS
    )
    schema = StartSandbox.model_json_schema()["properties"]["template"]
    assert schema["default"] is None and {"type": "null"} in schema["anyOf"]  # optional on the wire


async def test_one_create_walks_from_the_route_to_the_runtime(tmp_path: Path) -> None:
    """The hops as the create flow runs them: a body with every field set, posted to the route, arrives
    in the store's record, in the agent's start and in the runtime's spec."""
    c = await make_cluster(tmp_path, hosts=2, memory_mb=8192)
    try:
        h = c.as_(ADMIN)
        body = {
            "template": "default",
            "memory_mb": 1024,
            "cpus": 0.5,
            "stateful": True,
            "ttl_seconds": 600.0,
            "name": "walk",
            "metadata": {"team": "a"},
            "env": {"PLAIN": "p"},
            "secrets": {"TOKEN": "walk-secret-3e9a"},
            "failover": "recreate",
        }
        r = await c.http.post("/v1/sandboxes", json=body, headers=h)
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        rec = await c.plane.store.get_sandbox(sid)
        assert rec is not None and rec.host_id is not None
        assert (rec.template, rec.memory_mb, rec.cpus, rec.stateful) == ("default", 1024, 0.5, True)
        assert (rec.name, dict(rec.metadata), rec.failover) == ("walk", {"team": "a"}, "recreate")
        assert rec.expires_at == c.clock.now() + 600.0
        sealer = c.plane.creates.sealer
        sealed = await c.plane.store.sealed_spec(sid)
        assert sealer is not None and sealed is not None
        assert sealer.open(sid, sealed) == Spec(env=body["env"], secrets=body["secrets"])  # type: ignore[arg-type]

        agent = next(a for a in c.fleet.agents if a.id == rec.host_id)
        handle = next(x for x in await agent.runtime.list() if x.id == sid)
        assert handle.spec == SandboxSpec(
            id=sid,
            memory_mb=1024,
            cpus=0.5,
            template="default",
            stateful=True,
            env={"PLAIN": "p"},
            pids=DEFAULT_SANDBOX_PIDS,
            epoch=rec.epoch,
            leased=True,  # failover "recreate": it runs under its host's run lease
        )
        out = await c.http.post(f"/v1/sandboxes/{sid}/exec", json={"command": ["env"]}, headers=h)
        assert "PLAIN=p" in out.json()["stdout"] and "TOKEN=walk-secret-3e9a" in out.json()["stdout"]
    finally:
        await c.close()


async def test_an_image_template_s_sandbox_starts_on_its_image_with_its_disk(tmp_path: Path) -> None:
    """A template that names an image: its sandboxes keep that digest, start with its config (the
    create's env over the image's), and take the template's disk unless the create names one."""
    c = await make_cluster(tmp_path, hosts=2)
    try:
        h = c.as_(ADMIN)
        # The hosts fetch the image from the control plane's blob store before they start it.
        (tmp_path / "image").write_bytes(b"an image's bytes")
        image = digest_file(tmp_path / "image")
        assert c.plane.images.blobs is not None
        await c.plane.images.blobs.put(image, tmp_path / "image")
        config = ImageConfig(env={"LANG": "C.UTF-8", "PLAIN": "image"}, user="builder", workdir="/srv")
        await c.plane.store.create_template(
            TemplateRecord("py", 1.0, 512, image=image, image_config=config, disk_mb=256)
        )
        r = await c.http.post("/v1/sandboxes", json={"template": "py", "env": {"PLAIN": "p"}}, headers=h)
        assert r.status_code == 201, r.text
        assert (r.json()["image"], r.json()["disk_mb"]) == (image, 256)
        sid = r.json()["id"]
        rec = await c.plane.store.get_sandbox(sid)
        assert rec is not None and (rec.image, rec.disk_mb) == (image, 256)
        agent = next(a for a in c.fleet.agents if a.id == rec.host_id)
        spec = next(x for x in await agent.runtime.list() if x.id == sid).spec
        assert (spec.image, spec.disk_mb, spec.user, spec.workdir) == (image, 256, "builder", "/srv")
        assert spec.env == {"LANG": "C.UTF-8", "PLAIN": "p"}

        r = await c.http.post("/v1/sandboxes", json={"template": "py", "disk_mb": 2048}, headers=h)
        assert r.status_code == 201 and r.json()["disk_mb"] == 2048, r.text
        # No image, no disk to size: refused naming the field, nothing written.
        before = len((await c.plane.store.list_sandboxes()).items)
        r = await c.http.post("/v1/sandboxes", json={"template": "default", "disk_mb": 64}, headers=h)
        assert r.status_code == 422 and "disk_mb" in r.text, r.text
        assert len((await c.plane.store.list_sandboxes()).items) == before
        r = await c.http.post("/v1/sandboxes", json={"template": "py", "disk_mb": 1}, headers=h)
        assert r.status_code == 422, r.text
    finally:
        await c.close()
