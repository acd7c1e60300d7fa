"""Unit tests of the stopping rule (service/stats/stopping.py) and the score
calibration (service/stats/calibration.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stratameter.stats.calibration import SCORE_KINDS, resolve_kind, stratum_mean_probability, to_probability
from stratameter.stats.sketch import ScoreHistogram
from stratameter.stats.stopping import DEFAULT_ROUNDS, next_streak, should_stop

# ---------------------------------------------------------------- stopping


def test_next_streak_hand_cases():
    streak = np.array([0, 1, 2, 5, 3])
    hw = np.array([0.01, 0.02, np.nan, 0.015, 0.0150001])
    # met (<= delta) extends the streak; missed or NaN (no interval yet) resets it
    assert next_streak(streak, hw, 0.015).tolist() == [1, 0, 0, 6, 0]


def test_next_streak_scalar_and_infinite_halfwidth():
    assert int(next_streak(0, 0.001, 0.01)) == 1
    assert int(next_streak(4, np.inf, 0.01)) == 0
    assert int(next_streak(4, -np.inf, 0.01)) == 0  # not a finite half-width: no interval


@pytest.mark.parametrize("delta", [0.0, -0.1, float("nan")])
def test_next_streak_bad_delta(delta):
    with pytest.raises(ValueError, match="delta must be > 0"):
        next_streak(np.array([0]), np.array([0.01]), delta)


def test_should_stop_hand_cases():
    assert should_stop(np.array([0, 1, 2, 3])).tolist() == [False, False, True, True]
    assert DEFAULT_ROUNDS == 2  # Bennett & Carvalho's T = 2
    assert should_stop(np.array([0, 1, 2]), rounds=1).tolist() == [False, True, True]
    assert should_stop(np.array([2, 3]), rounds=3).tolist() == [False, True]


def test_should_stop_bad_rounds():
    with pytest.raises(ValueError, match="rounds must be >= 1"):
        should_stop(np.array([5]), rounds=0)


def test_streak_then_stop_sequence():
    # T = 2: a single spurious narrow interval does not stop; two in a row do
    streak, stops = np.array([0]), []
    for hw in (0.02, 0.009, 0.011, 0.008, np.nan, 0.009, 0.01):
        streak = next_streak(streak, np.array([hw]), 0.01)
        stops.append(bool(should_stop(streak)[0]))
    assert stops == [False, False, False, False, False, False, True]


# ---------------------------------------------------------------- calibration


def test_resolve_kind_auto_and_explicit():
    assert resolve_kind("auto", 0.0, 1.0) == "probability"
    assert resolve_kind("auto", 0.2, 0.7) == "probability"
    assert resolve_kind("auto", -0.1, 0.9) == "logit"
    assert resolve_kind("auto", 0.2, 1.0001) == "logit"
    assert resolve_kind("auto", 0.5, 11.0) == "logit"
    assert resolve_kind("probability", -5.0, 5.0) == "probability"
    assert resolve_kind("logit", 0.2, 0.7) == "logit"
    assert set(SCORE_KINDS) == {"auto", "probability", "logit"}


def test_resolve_kind_unknown():
    with pytest.raises(ValueError, match="score kind must be one of"):
        resolve_kind("platt", 0.0, 1.0)


def test_to_probability_logit_is_expit():
    s = np.array([-2.0, 0.0, 2.0, 40.0, -800.0])
    want = [1 / (1 + math.exp(2.0)), 0.5, 1 / (1 + math.exp(-2.0)), 1.0, 0.0]
    np.testing.assert_allclose(to_probability(s, "logit"), want, rtol=1e-12, atol=1e-300)
    assert to_probability(np.array([2.0]), "logit")[0] == pytest.approx(0.8807970779778823, rel=1e-12)


def test_to_probability_clips_probabilities():
    got = to_probability(np.array([-0.2, 0.0, 0.3, 1.0, 1.7]), "probability")
    assert got.tolist() == [0.0, 0.0, 0.3, 1.0, 1.0]


def test_to_probability_needs_a_concrete_kind():
    with pytest.raises(ValueError, match="'probability' or 'logit'"):
        to_probability(np.array([0.5]), "auto")


def _bucket_width_at(s: float) -> float:
    # a bucket is 2/4096 wide in u = s/(1+|s|): (1 + |s|)^2 * 2/4096 in score units
    return (1 + abs(s)) ** 2 * 2 / 4096


def test_stratum_mean_probability_hand_case_probabilities():
    scores = np.array([0.1, 0.2, 0.2, 0.8, 0.9])
    h = ScoreHistogram.from_scores(scores)
    got = stratum_mean_probability(h, np.array([0.5]))
    # means of the scores, (0.1 + 0.2 + 0.2)/3 and (0.8 + 0.9)/2, to bucket resolution
    tol = _bucket_width_at(1.0)
    np.testing.assert_allclose(got, [0.5 / 3, 0.85], atol=tol)


def test_stratum_mean_probability_hand_case_logits():
    scores = np.array([-2.0, -2.0, 1.0, 3.0])
    h = ScoreHistogram.from_scores(scores)
    got = stratum_mean_probability(h, np.array([0.0]))  # auto -> logit (scores outside [0, 1])
    e = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    tol = _bucket_width_at(3.0) / 4  # expit' <= 1/4
    np.testing.assert_allclose(got, [e(-2.0), (e(1.0) + e(3.0)) / 2], atol=tol)
    # forcing "probability" clips the logits into [0, 1] instead
    forced = stratum_mean_probability(h, np.array([0.0]), kind="probability")
    np.testing.assert_allclose(forced, [0.0, 1.0], atol=1e-12)


def test_stratum_mean_probability_empty_stratum_is_one_half_and_no_cut_is_overall_mean():
    h = ScoreHistogram.from_scores(np.array([0.1, 0.9]))
    got = stratum_mean_probability(h, np.array([0.4, 0.6]))
    assert got[1] == 0.5
    assert got.shape == (3,)
    overall = stratum_mean_probability(h, np.array([]))
    np.testing.assert_allclose(overall, [0.5], atol=_bucket_width_at(1.0))


def test_stratum_mean_probability_of_a_large_sample_matches_the_exact_means():
    x = np.random.default_rng(2).beta(4.0, 1.5, 100_000)
    cuts = np.quantile(x, [0.25, 0.5, 0.75])
    got = stratum_mean_probability(ScoreHistogram.from_scores(x), cuts)
    stratum = np.searchsorted(cuts, x, side="right")
    want = [x[stratum == k].mean() for k in range(4)]
    np.testing.assert_allclose(got, want, atol=1e-3)


def test_stratum_mean_probability_unknown_kind():
    with pytest.raises(ValueError, match="score kind must be one of"):
        stratum_mean_probability(ScoreHistogram.from_scores(np.array([0.1])), np.array([]), kind="odds")
