"""One review budget across a group of classifiers (`stats.fleet`): the forecast, its inverse and
the minimax allocation, on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.stats import fleet


def forecast(hw, n, items=np.inf, delta=0.05, room=1e9, weight=1.0) -> fleet.Forecast:
    hw = np.asarray(hw, dtype=float)
    full = lambda x: np.broadcast_to(np.asarray(x, dtype=float), hw.shape)  # noqa: E731
    return fleet.Forecast(hw, full(n), full(items), full(delta), full(room), full(weight))


def test_the_forecast_goes_as_one_over_labels_less_one_over_items():
    """hw 0.1 on 100 labels: 400 labels halve it on an unbounded chunk; on a chunk of 400 items
    they are all of it (half-width 0); 300 more labels on 1,000 items: sqrt((1/400 - 1/1000) /
    (1/100 - 1/1000)) = sqrt(0.0015 / 0.009) = 0.40825."""
    assert fleet.halfwidth_after(forecast([0.1], 100), 300) == pytest.approx([0.05])
    assert fleet.halfwidth_after(forecast([0.1], 100, items=400), 300) == pytest.approx([0.0])
    assert fleet.halfwidth_after(forecast([0.1], 100, items=1000), 300) == pytest.approx([0.1 * 0.408248], rel=1e-5)


def test_labels_to_a_halfwidth_invert_the_forecast():
    """From hw 0.1 on 100 labels to 0.05: 300 more unbounded; on 1,000 items
    1 / (1/1000 + (1/100 - 1/1000) / 4) - 100 = 307.69 - 100 = 207.69; none when already there."""
    assert fleet.labels_to_halfwidth(forecast([0.1], 100), 0.05) == pytest.approx([300.0])
    assert fleet.labels_to_halfwidth(forecast([0.1], 100, items=1000), 0.05) == pytest.approx([207.6923], rel=1e-6)
    assert fleet.labels_to_halfwidth(forecast([0.04], 100), 0.05).tolist() == [0.0]
    f = forecast([0.1], 100, items=1000)
    assert fleet.halfwidth_after(f, fleet.labels_to_halfwidth(f, 0.07)) == pytest.approx([0.07])


def test_the_budget_goes_where_it_lowers_the_worst_ratio():
    """A at hw 0.2 (ratio 4) and B at 0.1 (ratio 2), 100 labels each, delta 0.05, 700 labels: at
    the common level L both need 100 (16/L^2 - 1) + 100 (4/L^2 - 1) = 700, L^2 = 20/9, so A gets
    100 (7.2 - 1) = 620 and B 100 (1.8 - 1) = 80; both end at ratio 1.4907.  An equal split (350
    each) leaves A at 4 sqrt(100/450) = 1.886: the shared budget's worst is 0.79 x the split's."""
    f = forecast([0.2, 0.1], 100)
    give = fleet.share_budget(f, 700)
    assert give.tolist() == [620, 80]
    after = fleet.halfwidth_after(f, give) / 0.05
    assert after == pytest.approx([1.4907, 1.4907], abs=1e-3)
    split = fleet.halfwidth_after(f, np.array([350.0, 350.0])) / 0.05
    assert split.max() == pytest.approx(1.8856, abs=1e-3) and after.max() / split.max() < 0.8


def test_a_classifier_within_its_delta_or_without_an_interval_gets_nothing():
    """C is within its delta (0.04 <= 0.05) and D has no interval yet (its warm-up is its own):
    all of the 700 go to A and B as above."""
    give = fleet.share_budget(forecast([0.2, 0.1, 0.04, np.inf], 100), 700)
    assert give.tolist() == [620, 80, 0, 0]


def test_no_classifier_gets_more_than_its_room_or_than_reaching_its_delta():
    """A can take 200 more (its reservoirs), B needs 100 (4 - 1) = 300 to reach its delta: 500 of
    the 700 are given and 200 stay unspent (nothing is won by them)."""
    give = fleet.share_budget(forecast([0.2, 0.1], 100, room=[200, 1e9]), 700)
    assert give.tolist() == [200, 300]


def test_a_weight_raises_a_classifier_s_claim():
    """B weighted 2 (ratio 2 x 2 = 4) against A (ratio 4): they tie and split by the same level,
    A needs 100 (16/L^2 - 1), B 100 (16/L^2 - 1) against 0.1 / 0.05 x 2; each gets half of 600."""
    give = fleet.share_budget(forecast([0.2, 0.1], 100, weight=[1.0, 2.0]), 600)
    assert give.tolist() == [300, 300]


def test_the_allocation_is_vectorised_over_runs_and_spends_what_rounding_leaves():
    """Two runs stacked give each run's own answer; a budget that does not divide evenly is all
    given (the labels rounding leaves go to the largest ratios)."""
    one, two = forecast([0.2, 0.1], 100), forecast([0.3, 0.3], [50, 80])
    both = fleet.Forecast(*(np.stack([getattr(one, k), getattr(two, k)]) for k in
                            ("halfwidth", "labels", "items", "delta", "room", "weight")))
    got = fleet.share_budget(both, np.array([700, 333]))
    assert got[0].tolist() == fleet.share_budget(one, 700).tolist()
    assert got[1].tolist() == fleet.share_budget(two, 333).tolist()
    assert got[1].sum() == 333
    assert fleet.share_budget(one, 0).tolist() == [0, 0]
