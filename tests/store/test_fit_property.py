"""The store and the core agree on every reservation, on both backends: for random fleets (totals, use,
admission modes, drain, stream restore, templates, live and expired claims) and random requests,
``reserve``, ``reserve_best`` and ``reserve_batch`` take exactly what the core's ``host_fits`` admits,
``reserve_best`` takes the host the core's spread score and tie-break put first, and a batch places
exactly what the core, placing its items one after another, would.

The model below is built from the generated facts alone (never read back from the store), and follows
each accepted claim, so every step checks the store against the core on the state it left.

CPU amounts are multiples of 1/8: the store keeps millicores, and eighths are exact both as millicores
and as binary fractions, so a difference here is a difference of rule, not of rounding."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.core import (
    TAKES_STATE,
    AdmissionMode,
    CreateRequest,
    HostFacts,
    HostState,
    HostView,
    ManualClock,
    Pending,
    Scorer,
    host_fits,
    request_charge_mb,
    tie_rank,
)
from corral.store import HostReport, ReserveItem, Store

_ids = itertools.count()
SCORER = Scorer()
SHORT_TTL, LONG_TTL = 1.0, 3600.0

eighths = st.integers(min_value=0, max_value=64).map(lambda n: n / 8)


@dataclass(frozen=True)
class HostSpec:
    admittable: int
    spare: int  # memory_mb_total - admittable
    mode: AdmissionMode
    cpu_total: float
    cpu_used: float
    draining: bool
    stream_restore: bool
    templates: frozenset[str] | None


@dataclass(frozen=True)
class Ask:
    memory_mb: int
    cpu: float
    stateful: bool

    def request(self) -> CreateRequest:
        return CreateRequest(memory_mb=self.memory_mb, cpu=self.cpu, stateful=self.stateful)


@dataclass(frozen=True)
class Fleet:
    hosts: list[HostSpec]
    # (host index, ask, expires soon): claims made before the checks, some of which expire
    claims: list[tuple[int, Ask, bool]]
    batch: list[tuple[int, Ask]]
    single: tuple[int, Ask]
    best_mode: AdmissionMode
    best: Ask


host_specs = st.builds(
    HostSpec,
    admittable=st.integers(min_value=-512, max_value=6000),
    spare=st.integers(min_value=0, max_value=8000),
    mode=st.sampled_from(AdmissionMode),
    cpu_total=st.integers(min_value=0, max_value=16).map(float),
    cpu_used=eighths,
    draining=st.booleans(),
    stream_restore=st.booleans(),
    templates=st.one_of(st.none(), st.frozensets(st.sampled_from(["base", "py", "node"]), max_size=2)),
)
# Sizes cluster on a few values so hosts often tie and requests often sit at a boundary.
asks = st.builds(
    Ask,
    memory_mb=st.one_of(st.sampled_from([256, 512, 1024, 2048]), st.integers(min_value=1, max_value=7000)),
    cpu=st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0]), eighths),
    stateful=st.booleans(),
)


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    hosts = draw(
        st.one_of(
            st.lists(host_specs, min_size=1, max_size=5),
            # identical hosts: only the tie-break tells them apart
            st.tuples(host_specs, st.integers(min_value=2, max_value=4)).map(lambda t: [t[0]] * t[1]),
        )
    )
    index = st.integers(min_value=0, max_value=len(hosts) - 1)
    return Fleet(
        hosts=hosts,
        claims=draw(st.lists(st.tuples(index, asks, st.booleans()), max_size=5)),
        batch=draw(st.lists(st.tuples(index, asks), min_size=1, max_size=4)),
        single=draw(st.tuples(index, asks)),
        best_mode=draw(st.sampled_from(AdmissionMode)),
        best=draw(asks),
    )


@dataclass
class Model:
    """The core's view of the fleet: each host's published facts and its live claims."""

    views: dict[str, HostView]
    pending: dict[str, Pending] = field(default_factory=dict)

    def pending_of(self, host_id: str) -> Pending:
        return self.pending.get(host_id, Pending())

    def fits(self, host_id: str, req: CreateRequest, pending: Pending | None = None) -> bool:
        view = self.views[host_id]
        p = self.pending_of(host_id) if pending is None else pending
        return view.state is TAKES_STATE and host_fits(view, p, req)

    def charge(self, host_id: str, req: CreateRequest) -> int:
        return request_charge_mb(req, self.views[host_id].memory_admission)

    def take(self, host_id: str, memory_mb: int, cpu: float) -> None:
        p = self.pending_of(host_id)
        self.pending[host_id] = Pending(p.memory_mb + memory_mb, p.cpu + cpu)

    def best(self, candidates: list[str], req: CreateRequest, salt: str) -> str | None:
        fitting = [h for h in candidates if self.fits(h, req)]
        if not fitting:
            return None
        score = {h: SCORER.score(self.views[h], self.pending_of(h), req) for h in fitting}
        return min(fitting, key=lambda h: (-score[h], tie_rank(salt, h), h))


async def _build(store: Store, clock: ManualClock, fleet: Fleet) -> tuple[Model, list[str]]:
    run = next(_ids)
    ids = [f"f{run:05d}-{i}" for i in range(len(fleet.hosts))]
    views: dict[str, HostView] = {}
    for hid, spec in zip(ids, fleet.hosts, strict=True):
        total = spec.admittable + spec.spare
        result = await store.upsert_heartbeat(
            HostReport(
                host_id=hid,
                seq=1,
                facts=HostFacts(
                    cpu_total=spec.cpu_total,
                    cpu_used=spec.cpu_used,
                    memory_mb_total=total,
                    memory_mb_used=max(0, total - spec.admittable),
                    memory_mb_admittable=spec.admittable,
                    memory_admission=spec.mode,
                    templates=spec.templates,
                    stream_restore=spec.stream_restore,
                ),
            )
        )
        if spec.draining:
            await store.drain(hid)
        views[hid] = replace(
            result.host.view(), state=HostState.DRAINING if spec.draining else HostState.READY
        )
        # the store holds the facts the agent published, as the core reads them
        assert (views[hid].memory_mb_admittable, views[hid].cpu_used) == (spec.admittable, spec.cpu_used)
    model = Model(views)
    expiring: list[tuple[str, int, float]] = []
    for i, ask, soon in fleet.claims:
        hid, req = ids[i], ask.request()
        charge = model.charge(hid, req)
        expect = model.fits(hid, req)
        got = await store.reserve(
            hid, memory_mb=charge, cpu=req.cpu, owner="setup", ttl_s=SHORT_TTL if soon else LONG_TTL
        )
        assert (got is not None) == expect, ("setup reserve", hid, req)
        if got is not None:
            model.take(hid, charge, req.cpu)
            if soon:
                expiring.append((hid, charge, req.cpu))
    # The short claims expire: still on the hosts' counters, no longer live.
    clock.advance(2 * SHORT_TTL)
    for hid, mb, cpu in expiring:
        model.take(hid, -mb, -cpu)
    return model, ids


async def _check(store: Store, clock: ManualClock, fleet: Fleet) -> None:
    model, ids = await _build(store, clock, fleet)

    # reserve_batch: the core places the items one after another, each seeing the ones before it.
    items, trial = [], Model(model.views, dict(model.pending))
    placed = True
    for i, ask in fleet.batch:
        hid, req = ids[i], ask.request()
        charge = trial.charge(hid, req)
        placed = placed and trial.fits(hid, req)
        trial.take(hid, charge, req.cpu)
        items.append(ReserveItem(hid, charge, req.cpu))
    got_batch = await store.reserve_batch(items, owner="batch", ttl_s=LONG_TTL)
    assert (got_batch is not None) == placed, ("reserve_batch", items)
    if got_batch is not None:
        assert [r.host_id for r in got_batch] == [it.host_id for it in items]
        model = trial

    # reserve on one named host
    i, ask = fleet.single
    hid, req = ids[i], ask.request()
    charge = model.charge(hid, req)
    got = await store.reserve(hid, memory_mb=charge, cpu=req.cpu, owner="one", ttl_s=LONG_TTL)
    assert (got is not None) == model.fits(hid, req), ("reserve", hid, req)
    if got is not None:
        model.take(hid, charge, req.cpu)

    # reserve_best among the hosts of one admission mode (they share the request's charge)
    req = fleet.best.request()
    candidates = [h for h in ids if model.views[h].memory_admission is fleet.best_mode]
    charge = request_charge_mb(req, fleet.best_mode)
    salt = f"sb-{next(_ids)}"
    expect_host = model.best(candidates, req, salt)
    best = await store.reserve_best(
        candidates, memory_mb=charge, cpu=req.cpu, owner="best", ttl_s=LONG_TTL, sandbox_id=salt
    )
    assert (best.host_id if best is not None else None) == expect_host, ("reserve_best", candidates, req)

    assert await store.audit() == []


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fleet=fleets())
async def test_every_reserve_takes_exactly_what_the_core_admits(
    store: Store, clock: ManualClock, fleet: Fleet
) -> None:
    await _check(store, clock, fleet)
