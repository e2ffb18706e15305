"""The in-memory store model is held to the SQL stores: random sequences of heartbeats (whole sets and
changes on a base, with right and wrong digests and bases), reservations (reserve, reserve_best,
batches: the fit rule's memory and CPU bounds, the spread score and the tie-break), their ends
(cancel, confirm, TTL, a lapsed owner), sandbox records (create with names, quotas, idempotency keys
and owners whose leases lapse, state changes, deletes that expect a state), the checks a warm claim
reads first, parked creates, OOM kills, sealed specs, warm pools and the tenant removed (then made
again under its name) give the same observable results on the model and on SQLite (and PostgreSQL),
step by step, listings included."""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from corral.core import HostFacts, ManualClock
from corral.core.listing import changes, digest_of
from corral.store import (
    UNSET,
    HostReport,
    Listing,
    ReservationRecord,
    ReserveItem,
    SandboxRecord,
    SandboxState,
    TemplateRecord,
    open_store,
)
from corral.store.contract import Store
from corral.testing.store import ModelStore
from tests.pg import drop_schema, new_schema_name, require_pg, with_schema

HOSTS = ["h0", "h1", "h2"]
OWNERS = ["ra", "rb"]
# The model takes claims of at least 1 MiB (the core's rule reads a request); no flow claims none.
MB = st.sampled_from([128, 512, 1024, 1536])
# Enough to meet the CPU bound: 4 cores overcommitted 4 times, less what a heartbeat says is used.
CPU = st.sampled_from([0.25, 0.5, 4.0, 9.0])
SANDBOX = st.integers(0, 7)
# How a heartbeat carries its listing: whole, or changes since the previous heartbeat (held or not),
# with its digest right, wrong or absent, or on a base the store cannot hold.
LISTING = st.sampled_from(
    ["whole", "whole", "whole_undigested", "changes", "changes", "changes", "bad_digest", "bad_base"]
)
HOST = st.sampled_from(HOSTS)
# The built-in template, one made at the start, and one that does not exist.
TEMPLATES = st.sampled_from(["default", "big", "nope"])
STATES = st.sampled_from(
    [
        SandboxState.RESERVED,
        SandboxState.RUNNING,
        SandboxState.STOPPED,
        SandboxState.DELETED,
        SandboxState.ORPHANED,
    ]
)

OPS = st.one_of(
    st.tuples(
        st.just("beat"),
        HOST,
        # Few values, so hosts often tie and the tie-break decides.
        st.sampled_from([0, 1024, 2048, 2048, 3072]),
        st.booleans(),
        st.dictionaries(SANDBOX, st.integers(1, 2), max_size=5),
        LISTING,
        st.sampled_from([1.0, 1.0, 12.0]),
        st.sampled_from([False, False, True]),
    ),
    st.tuples(
        st.just("reserve"),
        st.sampled_from([*HOSTS, "hx"]),
        MB,
        st.sampled_from(OWNERS),
        st.sampled_from([1.0, 5.0, 30.0]),
        st.none() | SANDBOX,
        CPU,
    ),
    st.tuples(
        st.just("reserve_best"),
        st.lists(st.sampled_from([*HOSTS, *HOSTS, "hx"]), min_size=0, max_size=4),
        MB,
        st.sampled_from(OWNERS),
        st.sampled_from([1.0, 5.0, 30.0]),
        SANDBOX,
        CPU,
    ),
    st.tuples(
        st.just("batch"),
        st.lists(st.tuples(HOST, MB, CPU), min_size=0, max_size=4),
        st.sampled_from(OWNERS),
    ),
    st.tuples(st.just("prune"), st.sampled_from([0.5, 5.0])),
    st.tuples(st.sampled_from(["cancel", "confirm"]), st.integers(0, 12)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 2.0, 10.0])),
    st.tuples(st.sampled_from(["sweep", "expire_replicas", "expire_replicas", "next_expiry"])),
    st.tuples(st.just("renew"), st.sampled_from(OWNERS), st.sampled_from([1.0, 20.0])),
    st.tuples(
        st.just("create"),
        st.sampled_from([None, "a", "b"]),
        st.sampled_from([256, 512, 1024]),
        st.sampled_from([None, "k1", "k2"]),
        st.sampled_from(["x", "y"]),
        st.sampled_from([None, *OWNERS, "rz"]),
    ),
    st.tuples(st.just("delete"), st.integers(0, 7), st.booleans(), st.none() | STATES),
    st.tuples(st.just("set_state"), st.integers(0, 7), STATES, st.none() | STATES, st.booleans()),
    st.tuples(st.just("drain"), HOST),
    st.tuples(st.just("remove_tenant")),
    st.tuples(
        st.just("check_create"),
        st.sampled_from([None, "a", "b"]),
        st.sampled_from([256, 512, 1024]),
        st.sampled_from([None, "k1", "k2"]),
        st.sampled_from(["x", "y"]),
    ),
    st.tuples(st.just("park"), st.integers(0, 7), st.sampled_from([1.0, 30.0])),
    st.tuples(st.just("oom"), st.sampled_from(["h0", "h1"]), st.integers(0, 7), st.integers(0, 3)),
    st.tuples(st.just("reseal"), st.integers(0, 7), st.booleans()),
    st.tuples(
        st.just("pool_create"),
        TEMPLATES,
        st.sampled_from([-1, 0, 3]),
        st.sampled_from([None, 0, 2]),
    ),
    st.tuples(
        st.just("pool_update"),
        TEMPLATES,
        st.none() | st.sampled_from([-1, 1, 5]),
        st.sampled_from(["unset", None, 0, 1]),
    ),
    st.tuples(st.just("pool_delete"), TEMPLATES),
    st.tuples(
        st.just("pool_targets"),
        TEMPLATES,
        st.dictionaries(HOST, st.sampled_from([-1, 0, 1, 2]), max_size=3),
    ),
)


# Every sequence starts from hosts of different room and owners of different leases, so that the
# random steps after it meet ranking, folding and lapsed owners early.
PRELUDE: list[tuple[Any, ...]] = [
    ("beat", "h0", 2048, False, {}, "whole", 1.0, False),
    ("beat", "h1", 3072, False, {}, "whole", 1.0, False),
    ("beat", "h2", 1024, False, {}, "whole", 1.0, True),
    ("renew", "ra", 1.0),
    ("renew", "rb", 20.0),
    ("pool_create", "big", 3, None),
]


# What the n-th create asks: with the tenant's 3 CPUs, the CPU quota is hit as often as the others.
SANDBOX_CPUS = (1.0, 0.5, 1.75, 0.25)
TENANT_QUOTA: dict[str, Any] = {"max_sandboxes": 4, "max_memory_mb": 2048, "max_cpus": 3.0}


class Driver:
    """One store under the sequence, with what it handed out numbered in order (ids differ)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.tenant = ""
        self.reservations: list[str] = []
        self.seq: dict[str, int] = {}
        # Host -> the listing its previous heartbeat described (what changes are taken against).
        self.sent: dict[str, dict[str, int]] = {}

    def record(self, n: int, name: str | None, mb: int, owner: str | None = None) -> SandboxRecord:
        # Every other sandbox carries a sealed spec, for re-sealing to find.
        sealed = f"sealed-{n}" if n % 2 == 0 else None
        return SandboxRecord(
            id=f"sb-{n}",
            tenant_id=self.tenant,
            template="default",
            memory_mb=mb,
            cpus=SANDBOX_CPUS[n % len(SANDBOX_CPUS)],
            name=name,
            sealed_spec=sealed,
            owner=owner,
        )

    def res(self, r: ReservationRecord | None) -> object:
        if r is None:
            return None
        self.reservations.append(r.id)
        return (r.host_id, r.memory_mb, r.cpu, r.owner, r.sandbox_id, r.created_at, r.expires_at)

    async def op(self, op: tuple[Any, ...], n_created: int) -> object:
        s = self.store
        kind = op[0]
        if kind == "beat":
            _, host, admittable, stale, listed, how, cpu_used, stream = op
            seq = self.seq.get(host, 0) + (0 if stale and host in self.seq else 1)
            base = self.seq.get(host)
            self.seq[host] = seq
            now = {f"sb-{i}": epoch for i, epoch in listed.items()}
            before = self.sent.get(host, {})
            self.sent[host] = now
            if how.startswith("whole") or base is None:
                listing = Listing(None, now, digest=None if how == "whole_undigested" else digest_of(now))
            else:
                added, removed = changes(before, now)
                digest = digest_of(now) ^ (1 if how == "bad_digest" else 0)
                listing = Listing(base - 5 if how == "bad_base" else base, added, frozenset(removed), digest)
            facts = HostFacts(
                cpu_total=4.0,
                cpu_used=cpu_used,
                memory_mb_total=4096,
                memory_mb_used=0,
                memory_mb_admittable=admittable,
                stream_restore=stream,
            )
            got = await s.upsert_heartbeat(HostReport(host_id=host, seq=seq, facts=facts, listing=listing))
            return (got.accepted, got.confirmed, sorted(got.fenced), got.listed_seq)
        if kind == "reserve":
            _, host, mb, owner, ttl, sb, cpu = op
            sid = None if sb is None else f"sb-{sb}"
            return self.res(
                await s.reserve(host, memory_mb=mb, cpu=cpu, owner=owner, ttl_s=ttl, sandbox_id=sid)
            )
        if kind == "reserve_best":
            # With a sandbox id: the tie-break's salt is then the same in both stores.
            _, cands, mb, owner, ttl, sb, cpu = op
            return self.res(
                await s.reserve_best(
                    cands, memory_mb=mb, cpu=cpu, owner=owner, ttl_s=ttl, sandbox_id=f"sb-{sb}"
                )
            )
        if kind == "batch":
            _, items, owner = op
            got = await s.reserve_batch(
                [ReserveItem(h, mb, cpu) for h, mb, cpu in items], owner=owner, ttl_s=5.0
            )
            return None if got is None else [self.res(r) for r in got]
        if kind == "prune":
            return await s.prune_listings(s.clock.now() - op[1])
        if kind in ("cancel", "confirm"):
            rid = self.reservations[op[1]] if op[1] < len(self.reservations) else "nope"
            return await getattr(s, kind)(rid)
        if kind == "sweep":
            return await s.sweep_expired()
        if kind == "expire_replicas":
            return await s.expire_replicas()
        if kind == "next_expiry":
            return await s.next_expiry()
        if kind == "renew":
            return await s.renew_replica(op[1], op[2])
        if kind == "create":
            _, name, mb, key, body, owner = op
            out = await s.create_sandbox(
                self.record(n_created, name, mb, owner),
                idempotency_key=key,
                request_hash=body if key else None,
            )
            return (_fields(out.record), out.replayed)
        if kind == "check_create":
            _, name, mb, key, body = op
            seen = await s.check_create(
                self.record(n_created, name, mb), idempotency_key=key, request_hash=body if key else None
            )
            return None if seen is None else (_fields(seen.record), seen.replayed)
        if kind == "park":
            return _fields(await s.park_sandbox(f"sb-{op[1]}", s.clock.now() + op[2]))
        if kind == "oom":
            return await s.record_oom_kills(op[1], {f"sb-{op[2]}": op[3]})
        if kind == "reseal":
            _, i, right = op
            old = f"sealed-{i}" if right else "stale"
            return await s.replace_sealed_spec(f"sb-{i}", old, f"resealed-{i}")
        if kind == "pool_create":
            _, tpl, size, mph = op
            return await s.create_pool(tpl, size=size, max_per_host=mph)
        if kind == "pool_update":
            _, tpl, size, mph = op
            return await s.update_pool(tpl, size=size, max_per_host=UNSET if mph == "unset" else mph)
        if kind == "pool_delete":
            return await s.delete_pool(op[1])
        if kind == "pool_targets":
            return await s.set_pool_targets(op[1], op[2])
        if kind == "delete":
            return await s.delete_sandbox(f"sb-{op[1]}", forget_idempotency=op[2], expect=op[3])
        if kind == "set_state":
            _, i, state, expect, host = op
            got = await s.set_sandbox_state(f"sb-{i}", state, expect=expect, host_id="h0" if host else UNSET)
            return _fields(got)
        if kind == "drain":
            return _host(await s.drain(op[1]))
        if kind == "remove_tenant":
            # Refused while a sandbox of its is live; once removed, made again under its name, so the
            # sequence goes on with a tenant that must own nothing of the removed one.
            removed = await s.delete_tenant(self.tenant)
            self.tenant = (await s.create_tenant("t", **TENANT_QUOTA)).id
            return removed
        raise AssertionError(kind)

    async def observe(self) -> object:
        s = self.store
        hosts = [_host(h) for h in await s.list_hosts()]
        usage = await s.usage(self.tenant)
        page = await s.list_sandboxes(limit=1000)
        ids = [f"sb-{i}" for i in range(8)]
        listings = (
            sorted(await s.listing_changes(0.0), key=lambda c: (c.host_id, c.sandbox_id)),
            sorted(await s.listing_disputes(0.0), key=lambda c: (c.host_id, c.sandbox_id)),
            [await s.listed(h, ids) for h in HOSTS],
            sorted(await s.listed_hosts(ids)),  # which of several hosts is either store's choice
            await s.committed_mb(),
            sorted(await s.get_sandboxes([*ids, "nope"])),
            sorted(await s.abandoned([*ids, "nope"])),
        )
        intent = (
            await s.list_pools(),
            await s.list_templates(),
            await s.sealed_specs("", 1000),
            await s.sealed_specs("sb-2", 2),
        )
        # Tenant ids are random in each store: the one tenant is the same tenant.
        summaries = [x._replace(tenant_id="") for x in await s.list_sandbox_summaries()]
        return hosts, usage, [_fields(r) for r in page.items], listings, intent, summaries


def _fields(r: SandboxRecord) -> dict[str, object]:
    # Tenant ids are random in each store: the one tenant is the same tenant.
    return {k: getattr(r, k) for k in SandboxRecord.__slots__ if k not in ("sealed_spec", "tenant_id")}  # type: ignore[attr-defined]


def _host(h: Any) -> tuple[object, ...]:
    return (
        h.id,
        h.heartbeat_at,
        h.memory_mb_admittable,
        h.reserved_mb,
        h.reserved_cpu,
        h.state,
        h.seq,
        h.cpu_used,
        h.stream_restore,
        h.sandbox_count,
        h.listed_seq,
        h.listed_at,
    )


async def _outcome(d: Driver, op: tuple[Any, ...], created: int) -> object:
    try:
        return ("ok", await d.op(op, created))
    except Exception as exc:
        return ("error", type(exc).__name__)


async def _compare(ops: list[tuple[Any, ...]], url: str) -> None:
    clock = ManualClock(1_000_000.0)
    sql: Store = open_store(url, clock=clock)
    await sql.migrate()
    try:
        model = ModelStore(clock, random.Random(0))
        drivers = [Driver(model), Driver(sql)]
        for d in drivers:
            d.tenant = (await d.store.create_tenant("t", **TENANT_QUOTA)).id
            await d.store.create_template(TemplateRecord("big", cpus=2.0, memory_mb=1024))
        created = 0
        for step, op in enumerate(PRELUDE + ops):
            if op[0] == "advance":
                clock.advance(op[1])  # one clock: both stores see the same time
                continue
            got = [await _outcome(d, op, created) for d in drivers]
            if op[0] == "create":  # a check creates nothing: the next create takes the same id
                created += 1
            assert got[0] == got[1], f"step {step} {op} of {ops}: model {got[0]} != sql {got[1]}"
            seen = [await d.observe() for d in drivers]
            assert seen[0] == seen[1], f"after step {step} {op}: model {seen[0]} != sql {seen[1]}"
    finally:
        await sql.close()


# Three hosts alike: every pick is the tie-break's.
TIES: list[tuple[Any, ...]] = [
    *(("beat", h, 2048, False, {}, "whole", 1.0, False) for h in HOSTS),
    *(("reserve_best", HOSTS, 128, "rb", 30.0, i, 0.25) for i in range(8)),
]


# Each of the calls beside the flows' ports at least once where its answer is not the trivial one: a
# warm claim's check (fresh, replayed, over quota), parking (a reserved record, then the same again),
# OOM kills (the host's, another host's, a lower count), re-sealing (right and stale), pools' targets
# (zeros dropped) and updates.
SIDE_PORTS: list[tuple[Any, ...]] = [
    ("create", "a", 512, "k1", "x", None),
    ("check_create", "b", 512, None, "x"),
    ("check_create", "c", 512, "k1", "x"),
    ("check_create", "a", 512, None, "x"),
    ("create", None, 256, None, "y", None),
    ("create", None, 256, None, "y", None),
    ("check_create", "d", 1536, None, "x"),
    ("park", 1, 30.0),
    ("park", 1, 30.0),
    ("set_state", 0, SandboxState.RUNNING, None, True),
    ("oom", "h0", 0, 2),
    ("oom", "h1", 0, 3),
    ("oom", "h0", 0, 1),
    ("reseal", 0, False),
    ("reseal", 2, True),
    ("reseal", 1, True),
    ("pool_targets", "big", {"h0": 2, "h1": 0, "h2": 1}),
    ("pool_update", "big", 5, 2),
    ("pool_update", "big", None, "unset"),
    ("pool_create", "default", 1, 1),
    ("pool_targets", "nope", {"h0": 1}),
    ("pool_delete", "big"),
    ("pool_update", "big", 1, None),
]


# A tenant removed: refused while a create of its is live (placed or parked), then with only ended
# records and a tombstone left (the ended go, the tombstone stays); its name, Idempotency-Key and quota
# are then the new tenant's alone.
REMOVAL: list[tuple[Any, ...]] = [
    ("create", "a", 512, "k1", "x", None),
    ("create", None, 256, None, "y", None),
    ("remove_tenant",),
    ("set_state", 0, SandboxState.STOPPED, None, False),
    ("set_state", 1, SandboxState.DELETED, None, True),
    ("create", None, 256, None, "y", None),
    ("park", 2, 30.0),
    ("remove_tenant",),
    ("delete", 2, False, None),
    ("remove_tenant",),
    ("create", "a", 512, "k1", "x", None),
    ("remove_tenant",),
]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OPS, min_size=1, max_size=40))
@example(TIES)
@example(SIDE_PORTS)
@example(REMOVAL)
def test_the_model_answers_as_sqlite_does(ops: list[tuple[Any, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_compare(ops, f"sqlite:///{Path(tmp) / 'corral.db'}"))


@pytest.mark.postgres
def test_the_model_answers_as_postgres_does() -> None:
    base = require_pg()

    @settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(OPS, min_size=1, max_size=30))
    def check(ops: list[tuple[Any, ...]]) -> None:
        schema = new_schema_name("corral_model")
        try:
            asyncio.run(_compare(ops, with_schema(base, schema)))
        finally:
            drop_schema(base, schema)

    check()
