"""A chunk's claim on its review group's shared budget (`chunks.group_plan`), pure, by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from stratameter.chunks import group_plan
from stratameter.chunks.group_plan import MemberForecast, labels_to_ask, member_forecast, share_of


def member(name, hw, n=100, items=math.inf, delta=0.05, room=1e9, weight=1.0, at_ms=0) -> MemberForecast:
    return MemberForecast(name, hw, n, items, delta, room, weight, at_ms)


def test_a_forecast_counts_the_requests_out_as_labels():
    """hw 0.1 on 100 labels of a 10,000-item chunk with 100 requests out: the group sees 200 labels
    and hw 0.1 sqrt((1/200 - 1/10000) / (1/100 - 1/10000)) = 0.1 sqrt(0.0049 / 0.0099) = 0.070353;
    its room is its capacity, 900, less the 200; its weight and delta are its settings'."""
    snapshot = SimpleNamespace(chunk=7, n=np.array([60, 40]), N=np.array([6000.0, 4000.0]), pending=100,
                               final_size=10_000.0, capacity=np.array([500.0, 400.0]))
    cfg = SimpleNamespace(delta=0.02, review_weight=1.5)
    f = member_forecast("spam", snapshot, SimpleNamespace(halfwidth=0.1), cfg, now_ms=123)
    assert f.member == "spam/7" and f.labels == 200 and f.room == 700.0 and f.items == 10_000.0
    assert f.halfwidth == pytest.approx(0.070353, rel=1e-5)
    assert (f.delta, f.weight, f.at_ms) == (0.02, 1.5, 123)


def test_a_chunk_without_labels_keeps_its_undefined_halfwidth():
    snapshot = SimpleNamespace(chunk=1, n=np.zeros(2), N=np.array([10.0, 10.0]), pending=8, final_size=50.0,
                               capacity=np.array([10.0, 10.0]))
    f = member_forecast("a", snapshot, SimpleNamespace(halfwidth=math.inf), SimpleNamespace(delta=0.05, review_weight=1.0), 0)
    assert f.halfwidth == math.inf and f.fixed_round and f.labels == 8 and f.room == 12.0


def test_a_forecast_survives_its_json_even_without_an_interval():
    """orjson writes inf as null: read back as inf."""
    for f in (member("a/1", 0.07), member("b/2", math.inf)):
        assert MemberForecast.from_json(f.to_json()) == f


def test_the_warm_up_and_the_confirming_rounds_are_fixed_rounds():
    assert member("a/1", math.inf).fixed_round
    assert member("a/1", 0.04, delta=0.05).fixed_round
    assert not member("a/1", 0.06, delta=0.05).fixed_round


def test_a_share_is_the_minimax_allocation_of_what_is_left():
    """`stats.fleet`'s hand case: ratios 4 and 2 on 100 labels each, 700 left: 620 and 80.  Each
    member computes its own share from the same forecasts, its own as it is now."""
    a, b = member("a/1", 0.2), member("b/1", 0.1)
    assert share_of(a, [a, b], 700) == 620
    assert share_of(b, [a, b], 700) == 80
    assert share_of(b, [a], 700) == 80  # its own forecast counts even when not yet written
    assert share_of(member("b/1", 0.1), [a, member("b/1", 0.5)], 700) == 80  # the stored one is replaced
    assert share_of(a, [a, b], 0) == 0


def test_what_a_chunk_asks_is_capped_by_its_items_due():
    """Out of a fixed round at most its share; in one at most the round's room (`fixed_round_room`:
    two labels a stratum of 4 strata, 8, less the 3 requests still out: 5)."""
    a, b = member("a/1", 0.2), member("b/1", 0.1)
    assert labels_to_ask(b, [a, b], due=500, left=700, round_room=8) == 80
    assert labels_to_ask(b, [a, b], due=30, left=700, round_room=8) == 30
    confirming = member("c/1", 0.04)
    room = group_plan.fixed_round_room(4, 2, pending=3)
    assert room == 5 and group_plan.fixed_round_room(4, 2, pending=9) == 0
    assert labels_to_ask(confirming, [a, b, confirming], due=16, left=700, round_room=room) == 5
    assert labels_to_ask(confirming, [a, b, confirming], due=16, left=3, round_room=room) == 3
    assert labels_to_ask(member("d/1", math.inf), [a, b], due=60, left=700, round_room=8) == 8  # the warm-up
    assert labels_to_ask(a, [a, b], due=0, left=700, round_room=8) == 0


def test_a_member_without_an_interval_counts_as_hard_as_the_hardest_known():
    """Known ratios hw / delta 0.2 / 0.05 = 4 and 0.1 / 0.05 = 2: a member without an interval at
    delta 0.02 reads 4 x 0.02 = 0.08.  So the first chunk with an interval does not take the
    budget the others will claim: A (ratio 4) and C (unknown, so 4, 100 labels each) share 700
    left as two equal claims, 350 each, where A alone would get all it needs."""
    hw = group_plan.as_hard_as_known(np.array([0.2, 0.1, math.inf]), np.array([0.05, 0.05, 0.02]))
    assert hw.tolist() == pytest.approx([0.2, 0.1, 0.08])
    assert np.isinf(group_plan.as_hard_as_known(np.array([math.inf]), np.array([0.05]))).all()
    a, c = member("a/1", 0.2), member("c/1", math.inf)
    assert share_of(a, [a, c], 700) == 350
    assert share_of(a, [a], 700) == 700


def test_only_fresh_forecasts_count():
    ttl = group_plan.FORECAST_TTL_SECONDS * 1000
    old, new = member("a/1", 0.2, at_ms=0), member("b/1", 0.1, at_ms=ttl)
    assert group_plan.fresh([old, new], now_ms=ttl) == [old, new]
    assert group_plan.fresh([old, new], now_ms=ttl + 1) == [new]
