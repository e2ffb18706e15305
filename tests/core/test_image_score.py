"""The image term of the score: a host holding the create's image is preferred, by a bonus small enough
that spreading still decides, and a host lacking it is never filtered out."""

from __future__ import annotations

import random

import pytest

from corral.core import CreateRequest, HostView, Placer
from corral.core.scoring import Scorer
from corral.core.types import NO_PENDING

IMG = "sha256:" + "ab" * 32


def _host(i: str, admittable: int = 20_000, images: frozenset[str] = frozenset()) -> HostView:
    return HostView(
        cpu_total=16.0,
        cpu_used=0.0,
        memory_mb_total=32_768,
        memory_mb_used=0,
        memory_mb_admittable=admittable,
        images=images,
        id=i,
        heartbeat_at=0.0,
    )


def test_a_host_holding_the_image_scores_higher_by_the_image_weight() -> None:
    s = Scorer()
    req = CreateRequest(memory_mb=512, image=IMG)
    with_it, without = _host("a", images=frozenset({IMG})), _host("b")
    assert s.score(with_it, NO_PENDING, req) - s.score(without, NO_PENDING, req) == pytest.approx(
        s.weights.image
    )
    # A create of no image, or of another, sees no difference.
    plain = CreateRequest(memory_mb=512)
    assert s.score(with_it, NO_PENDING, plain) == s.score(without, NO_PENDING, plain)


def test_holding_the_image_breaks_near_ties_but_not_real_gaps_and_refuses_nothing() -> None:
    placer = Placer()
    req = CreateRequest(memory_mb=512, image=IMG)
    rng = random.Random(1)
    near = [_host("a", 20_000), _host("b", 19_900, frozenset({IMG}))]
    assert placer.place(near, req, now=0.0, rng=rng).host.id == "b"
    far = [_host("a", 30_000), _host("b", 10_000, frozenset({IMG}))]
    assert placer.place(far, req, now=0.0, rng=rng).host.id == "a"
    alone = [_host("a", 1_000)]
    assert placer.place(alone, req, now=0.0, rng=rng).host.id == "a"
