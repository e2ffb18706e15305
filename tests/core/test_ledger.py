from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, invariant, rule

from corral.core import Ledger, ManualClock, Pending


def test_release_acts_once_and_pending_returns_to_zero() -> None:
    clock = ManualClock()
    led = Ledger(clock, ttl_s=30)
    a = led.reserve("h1", 1024, 1.0, owner="r1")
    b = led.reserve("h1", 512, 0.5, owner="r1")
    assert led.pending("h1") == Pending(1536, 1.5)
    assert a.release() is True
    assert a.release() is False
    assert led.pending("h1") == Pending(512, 0.5)
    assert b.release()
    assert led.pending("h1") == Pending(0, 0.0)
    assert led.outstanding() == {}


def test_expiry_against_the_injected_clock() -> None:
    clock = ManualClock()
    led = Ledger(clock, ttl_s=10)
    r = led.reserve("h1", 1024)
    clock.advance(9.99)
    assert r.active and led.pending("h1").memory_mb == 1024
    clock.advance(0.01)
    assert not r.active
    assert led.pending("h1").memory_mb == 0
    assert r.release() is False  # expired already: release is a no-op
    assert led.expired_total == 1


def test_drop_owner_ends_only_that_owners_claims() -> None:
    clock = ManualClock()
    led = Ledger(clock)
    led.reserve("h1", 100, owner="dead")
    led.reserve("h2", 200, owner="dead")
    keep = led.reserve("h1", 300, owner="alive")
    assert led.drop_owner("dead") == 2
    assert led.drop_owner("dead") == 0
    assert led.outstanding() == {"h1": Pending(300, 0.0)}
    assert keep.active


def test_next_expiry_skips_ended_claims() -> None:
    clock = ManualClock()
    led = Ledger(clock, ttl_s=10)
    first = led.reserve("h1", 1)
    clock.advance(1)
    led.reserve("h1", 1)
    assert led.next_expiry() == 10
    first.release()
    assert led.next_expiry() == 11
    clock.advance(20)
    assert led.next_expiry() is None


def test_negative_reservation_is_refused() -> None:
    with pytest.raises(ValueError):
        Ledger(ManualClock()).reserve("h1", -1)


HOSTS = ["h1", "h2", "h3"]
OWNERS = ["r1", "r2"]


class LedgerModel(RuleBasedStateMachine):
    """The ledger against a dictionary model: every claim ends exactly once, whatever the order of
    release, expiry and owner-drop, and pending is the sum of what is still live."""

    claims = Bundle("claims")

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.ledger = Ledger(self.clock, ttl_s=10)
        self.model: dict[int, tuple[str, int, float, str, float]] = {}
        self.ended: set[int] = set()

    def _expire_model(self) -> None:
        now = self.clock.now()
        for rid, (_, _, _, _, exp) in list(self.model.items()):
            if exp <= now:
                del self.model[rid]
                self.ended.add(rid)

    @rule(
        target=claims,
        host=st.sampled_from(HOSTS),
        mb=st.integers(0, 4096),
        cpu=st.sampled_from([0.0, 0.25, 1.0, 2.5]),
        owner=st.sampled_from(OWNERS),
        ttl=st.sampled_from([None, 1.0, 5.0]),
    )
    def reserve(self, host: str, mb: int, cpu: float, owner: str, ttl: float | None) -> object:
        res = self.ledger.reserve(host, mb, cpu, owner=owner, ttl_s=ttl)
        self._expire_model()
        self.model[res.id] = (host, mb, cpu, owner, self.clock.now() + (10 if ttl is None else ttl))
        return res

    @rule(res=claims)
    def release(self, res: object) -> None:
        self._expire_model()
        live = res.id in self.model  # type: ignore[attr-defined]
        assert res.release() is live  # type: ignore[attr-defined]
        if live:
            del self.model[res.id]  # type: ignore[attr-defined]
            self.ended.add(res.id)  # type: ignore[attr-defined]

    @rule(res=consumes(claims))
    def release_twice(self, res: object) -> None:
        self.release(res)
        assert res.release() is False  # type: ignore[attr-defined]

    @rule(owner=st.sampled_from(OWNERS))
    def drop_owner(self, owner: str) -> None:
        self._expire_model()
        mine = [rid for rid, v in self.model.items() if v[3] == owner]
        assert self.ledger.drop_owner(owner) == len(mine)
        for rid in mine:
            del self.model[rid]
            self.ended.add(rid)

    @rule(dt=st.sampled_from([0.5, 1.0, 3.0, 10.0]))
    def tick(self, dt: float) -> None:
        self.clock.advance(dt)

    @invariant()
    def pending_matches_model(self) -> None:
        self._expire_model()
        for h in HOSTS:
            p = self.ledger.pending(h)
            assert p.memory_mb >= 0 and p.cpu >= -1e-9
            assert p.memory_mb == sum(v[1] for v in self.model.values() if v[0] == h)
            assert abs(p.cpu - sum(v[2] for v in self.model.values() if v[0] == h)) < 1e-9
        assert len(self.ledger) == len(self.model)

    def teardown(self) -> None:
        # once every claim has ended, nothing is outstanding: exactly zero
        for owner in OWNERS:
            self.ledger.drop_owner(owner)
        assert self.ledger.outstanding() == {}
        assert self.ledger.outstanding_mb() == 0


TestLedgerModel = LedgerModel.TestCase
TestLedgerModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
