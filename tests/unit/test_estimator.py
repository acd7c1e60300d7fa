"""Unit and property tests of the stratified estimator (service/stats/estimator.py).

Hand cases follow Kumar & Raj (Eq. 4 estimate, Eq. 6 variance, Eq. 10 Neyman
bound), Bennett & Carvalho (2010, Sec. 5 m-estimate) and Wilson (1927).  The
Wilson interval's small-sample guards are being tuned elsewhere, so only its
public contract is tested here: textbook Wilson when the effective sample size
is the label count, limits in [0, 1] around the estimate, NaN without labels.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratameter.stats.estimator import (
    STOPPING_VARIANCE_MARGIN,
    adaptive_bias_corrected,
    bennett_smoothed,
    interval,
    normal_interval,
    stratified_estimate,
    stratified_variance,
    weights,
    wilson_interval,
    z_value,
)

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Z95 = 1.959963984540054  # Phi^-1(0.975)

# The running example: two strata of 100 and 300 items, 10 and 20 labels,
# 5 and 18 positives.  W = (0.25, 0.75), p_k = (0.5, 0.9).
N2, n2, h2 = [100, 300], [10, 20], [5, 18]


def textbook_wilson(p: float, n: float, z: float) -> tuple[float, float]:
    """Wilson (1927): (p + z^2/2n -+ z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n)."""
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


# ---------------------------------------------------------------- small pieces


def test_z_value_hand_values_and_bad_confidence():
    assert z_value(0.95) == pytest.approx(Z95, rel=1e-12)
    assert z_value(0.90) == pytest.approx(1.6448536269514722, rel=1e-12)
    assert z_value(0.99) == pytest.approx(2.5758293035489004, rel=1e-12)
    for bad in (0.0, 1.0, -0.5, 1.5, float("nan")):
        with pytest.raises(ValueError, match="confidence must be in"):
            z_value(bad)


def test_weights_hand_case_and_empty_population():
    np.testing.assert_allclose(weights([1, 3]), [0.25, 0.75])
    np.testing.assert_allclose(weights([[1, 1], [0, 5]]), [[0.5, 0.5], [0.0, 1.0]])
    with pytest.raises(ValueError, match="population is empty"):
        weights([0, 0])


def test_bennett_smoothed_hand_cases():
    # n = 0: m = 2, prior 0.5 -> (0 + 1) / 2
    assert bennett_smoothed(0, 0) == pytest.approx(0.5)
    # n = 4, h = 4: m = 1/sqrt(4) = 1/2 -> (4 + 1/4) / (4 + 1/2)
    assert bennett_smoothed(4, 4) == pytest.approx((4 + 0.25) / 4.5)
    # n = 9, h = 0: m = 1/3 -> (1/6) / (9 + 1/3)
    assert bennett_smoothed(9, 0) == pytest.approx((1 / 6) / (9 + 1 / 3))
    np.testing.assert_allclose(bennett_smoothed([0, 4], [0, 4]), [0.5, 4.25 / 4.5])


# ---------------------------------------------------------------- estimate and variance


def test_stratified_estimate_hand_case():
    # 0.25 * 5/10 + 0.75 * 18/20 = 0.125 + 0.675
    assert stratified_estimate(N2, n2, h2) == pytest.approx(0.8, abs=1e-15)


def test_stratified_estimate_is_vectorised_over_runs():
    n = np.array([[10, 20], [4, 4]])
    h = np.array([[5, 18], [4, 0]])
    np.testing.assert_allclose(stratified_estimate(N2, n, h), [0.8, 0.25])


def test_unlabelled_stratum_gives_nan_not_a_number():
    assert np.isnan(stratified_estimate([100, 300], [0, 20], [0, 18]))
    assert np.isinf(stratified_variance([100, 300], [0, 20], [0, 18]))


def test_empty_stratum_is_ignored():
    # N_k = 0: weight 0, no labels needed there
    assert stratified_estimate([0, 10], [0, 4], [0, 2]) == pytest.approx(0.5)
    assert stratified_variance([0, 10], [0, 4], [0, 2], fpc=False) == pytest.approx(0.25 / 3)


def test_stratified_variance_hand_case_without_fpc():
    # Kumar & Raj Eq. 6: sum W^2 p(1-p)/(n-1)
    want = 0.25**2 * 0.5 * 0.5 / 9 + 0.75**2 * 0.9 * 0.1 / 19
    assert stratified_variance(N2, n2, h2, fpc=False) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.004400584795, rel=1e-9)


def test_stratified_variance_hand_case_with_fpc():
    # finite population correction (1 - n_k / N_k) on each stratum's term
    want = 0.25**2 * (1 - 10 / 100) * 0.25 / 9 + 0.75**2 * (1 - 20 / 300) * 0.09 / 19
    assert stratified_variance(N2, n2, h2, fpc=True) == pytest.approx(want, rel=1e-12)
    assert want == pytest.approx(0.004049342105, rel=1e-9)


def test_one_label_in_a_stratum_gives_infinite_variance():
    assert np.isinf(stratified_variance([10, 10], [1, 5], [1, 2], fpc=False))
    assert np.isinf(stratified_variance([10, 10], [1, 5], [1, 2], fpc=True))


def test_fully_labelled_stratum_is_exact_with_fpc():
    # N_1 = n_1 = 1: that stratum is known exactly without replacement
    v = stratified_variance([1, 9], [1, 5], [1, 2], fpc=True)
    want = 0.9**2 * (1 - 5 / 9) * 0.4 * 0.6 / 4
    assert v == pytest.approx(want, rel=1e-12)
    assert np.isinf(stratified_variance([1, 9], [1, 5], [1, 2], fpc=False))


@pytest.mark.parametrize("N, n, h, what", [
    ([10, 10], [2, 3], [3, 1], "positives <= labels"),
    ([10, 10], [-1, 3], [0, 1], "positives <= labels"),
    ([10, 10], [2, 3], [-1, 1], "positives <= labels"),
    ([10, -10], [2, 3], [1, 1], "stratum sizes must be >= 0"),
])
def test_bad_counts_raise(N, n, h, what):
    for fn in (stratified_estimate, stratified_variance, wilson_interval, normal_interval):
        with pytest.raises(ValueError, match=what):
            fn(N, n, h)


@pytest.mark.parametrize("n, h", [([2, np.nan], [1, 1]), ([2, 2], [1, np.nan]), ([2, np.inf], [1, 1])])
def test_nan_counts_raise(n, h):
    # A NaN count must not turn into a finite estimate (it was 0.25 = the other stratum alone).
    for fn in (stratified_estimate, stratified_variance, wilson_interval, normal_interval):
        with pytest.raises(ValueError, match="counts must be finite"):
            fn([10, 10], n, h)


@pytest.mark.parametrize("N", [[10, np.nan], [10, np.inf], [np.nan, np.nan]])
def test_non_finite_sizes_raise(N):
    # a NaN/inf stratum size gave variance 0.0
    for fn in (stratified_estimate, stratified_variance, wilson_interval, normal_interval):
        with pytest.raises(ValueError, match="stratum sizes must be finite"):
            fn(N, [2, 2], [1, 1])
    with pytest.raises(ValueError, match="stratum sizes must be finite"):
        weights(N)


# ---------------------------------------------------------------- unbiasedness


def _binomial_runs(N, P, n, runs, seed):
    rng = np.random.default_rng(seed)
    return rng.binomial(np.broadcast_to(n, (runs, len(n))), P)


@pytest.mark.parametrize("N, P, n", [
    ([500, 300, 200], [0.2, 0.7, 0.95], [5, 10, 3]),
    ([100, 100], [0.5, 0.99], [2, 2]),
    ([1000, 10, 50, 5], [0.9, 0.1, 0.6, 1.0], [3, 7, 2, 4]),
])
def test_estimate_is_unbiased_for_a_fixed_allocation(N, P, n):
    runs = 40_000
    h = _binomial_runs(N, P, n, runs, seed=11)
    est = stratified_estimate(N, n, h)
    truth = float(np.dot(weights(N), P))
    se = est.std(ddof=1) / math.sqrt(runs)
    assert abs(est.mean() - truth) < 4 * se + 1e-12


@pytest.mark.parametrize("N, P, n", [
    ([500, 300, 200], [0.2, 0.7, 0.95], [5, 10, 3]),
    ([1000, 10, 50], [0.9, 0.1, 0.6], [3, 7, 2]),
])
def test_variance_estimate_is_unbiased_with_replacement(N, P, n):
    # Kumar & Raj Prop. 4: E[v] = V = sum W^2 P(1-P)/n (binomial sampling)
    runs = 40_000
    h = _binomial_runs(N, P, n, runs, seed=12)
    v = stratified_variance(N, n, h, fpc=False)
    W, P_, n_ = weights(N), np.asarray(P), np.asarray(n, float)
    V = float(np.sum(W**2 * P_ * (1 - P_) / n_))
    assert abs(v.mean() - V) < 4 * v.std(ddof=1) / math.sqrt(runs)
    # and the estimator's spread is what V says
    est = stratified_estimate(N, n, h)
    assert est.var(ddof=1) == pytest.approx(V, rel=0.05)


def test_estimate_is_unbiased_without_replacement():
    N, G, n = np.array([40, 25, 60]), np.array([10, 20, 59]), np.array([6, 5, 3])
    runs = 40_000
    rng = np.random.default_rng(13)
    h = rng.hypergeometric(np.broadcast_to(G, (runs, 3)), np.broadcast_to(N - G, (runs, 3)),
                           np.broadcast_to(n, (runs, 3)))
    est = stratified_estimate(N, n, h)
    truth = G.sum() / N.sum()
    assert abs(est.mean() - truth) < 4 * est.std(ddof=1) / math.sqrt(runs)
    # fpc variance is unbiased under sampling without replacement (Cochran 5.3)
    v = stratified_variance(N, n, h, fpc=True)
    S2 = N * (G / N) * (1 - G / N) / (N - 1)
    V = float(np.sum((N / N.sum())**2 * (1 - n / N) * S2 / n))
    assert abs(v.mean() - V) < 4 * v.std(ddof=1) / math.sqrt(runs)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 1000), st.floats(0, 1), st.integers(1, 8)), min_size=1, max_size=5),
       st.integers(0, 2**32 - 1))
def test_estimate_unbiased_property(strata, seed):
    N = [s[0] for s in strata]
    P = [s[1] for s in strata]
    n = [s[2] for s in strata]
    runs = 4000
    est = stratified_estimate(N, n, _binomial_runs(N, P, n, runs, seed))
    truth = float(np.dot(weights(N), P))
    # the true standard error (the sample one is 0 when P ~ 1 gives all ones)
    se = math.sqrt(float(np.sum(weights(N) ** 2 * np.multiply(P, np.subtract(1, P)) / n)) / runs)
    assert abs(est.mean() - truth) <= 4.5 * se + 1e-12


# ---------------------------------------------------------------- intervals


def test_normal_interval_hand_case():
    # Bennett & Carvalho: m-estimates p_k, var = sum W^2 p(1-p)/n, p +- z se
    p1 = (5 + 0.5 / math.sqrt(10)) / (10 + 1 / math.sqrt(10))
    p2 = (18 + 0.5 / math.sqrt(20)) / (20 + 1 / math.sqrt(20))
    est = 0.25 * p1 + 0.75 * p2
    se = math.sqrt(0.25**2 * p1 * (1 - p1) / 10 + 0.75**2 * p2 * (1 - p2) / 20)
    iv = normal_interval(N2, n2, h2, 0.95, fpc=False)
    assert iv.estimate == pytest.approx(est, rel=1e-12)
    assert iv.stderr == pytest.approx(se, rel=1e-12)
    assert iv.lower == pytest.approx(est - Z95 * se, rel=1e-9)
    assert iv.upper == pytest.approx(est + Z95 * se, rel=1e-9)
    assert iv.halfwidth == pytest.approx(Z95 * se, rel=1e-9)
    ivf = normal_interval(N2, n2, h2, 0.95, fpc=True)
    se_f = math.sqrt(0.25**2 * 0.9 * p1 * (1 - p1) / 10 + 0.75**2 * (1 - 20 / 300) * p2 * (1 - p2) / 20)
    assert ivf.stderr == pytest.approx(se_f, rel=1e-12)


def test_normal_interval_is_clipped_to_unit_interval_and_infinite_without_labels():
    iv = normal_interval([10], [2], [2], fpc=False)
    assert iv.upper == 1.0 and 0.0 <= iv.lower < iv.estimate
    iv0 = normal_interval([10, 10], [0, 4], [0, 2], fpc=False)
    assert np.isinf(iv0.stderr) and iv0.lower == 0.0 and iv0.upper == 1.0


@pytest.mark.parametrize("n", [2, 5, 20, 200])
@pytest.mark.parametrize("all_positive", [True, False])
def test_wilson_one_pure_stratum_is_textbook_wilson(n, all_positive):
    # A pure stratum has n_eff = n (documented), so this is Wilson (1927) exactly.
    h = n if all_positive else 0
    lo, hi = textbook_wilson(h / n, n, Z95)
    iv = wilson_interval([10**6], [n], [h], 0.95, fpc=False)
    assert iv.estimate == iv.estimate_at_stop == h / n  # the labels' proportion, not the interval's centre
    assert iv.lower == pytest.approx(lo, abs=1e-12)
    assert iv.upper == pytest.approx(hi, abs=1e-12)
    # by hand for 20/20: lower = 1 / (1 + z^2/20) = 20 / (20 + z^2)
    if n == 20 and all_positive:
        assert iv.lower == pytest.approx(20 / (20 + Z95**2), rel=1e-12) and iv.upper == 1.0


def test_wilson_several_pure_strata_use_the_total_label_count():
    iv = wilson_interval([100, 300, 50], [4, 6, 2], [4, 6, 2], 0.90, fpc=False)
    lo, hi = textbook_wilson(1.0, 12, z_value(0.90))
    assert (iv.lower, iv.upper) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))


@pytest.mark.parametrize("N, n, h", [(N2, n2, h2), ([50], [30], [21]), ([7, 90, 400], [3, 12, 9], [1, 7, 8])])
def test_wilson_is_wilson_at_the_effective_sample_size(N, n, h):
    # Whatever the variance guards, the documented form is Wilson's interval
    # around the bias-corrected estimate p (both terms: the estimate at the
    # stop) with n replaced by n_eff = p(1-p)/v, v = STOPPING_VARIANCE_MARGIN *
    # stderr^2; the estimate reported at any moment has the allocation's term alone.
    iv = wilson_interval(N, n, h, 0.95, fpc=False)
    p = float(adaptive_bias_corrected(N, n, h, var=iv.stderr**2))
    n_eff = p * (1 - p) / (STOPPING_VARIANCE_MARGIN * float(iv.stderr) ** 2)
    lo, hi = textbook_wilson(p, n_eff, Z95)
    assert iv.lower == pytest.approx(lo, abs=1e-12)
    assert iv.upper == pytest.approx(hi, abs=1e-12)
    assert float(iv.estimate_at_stop) == pytest.approx(p, abs=1e-12)
    now = float(adaptive_bias_corrected(N, n, h, var=iv.stderr**2, stop=False))
    assert float(iv.estimate) == pytest.approx(now, abs=1e-12)


def test_reported_estimate_hand_case():
    # N = (100, 300), n = (10, 20), h = (5, 18): W = (1/4, 3/4), p = (1/2, 9/10).
    # Stratum 1: pbar = 5.5/11 = 1/2, so g = (1 - 2 pbar) / (2 pbar (1 - pbar)) = 0: no shift.
    # Stratum 2: pbar = 18.5/21, g = (1 - 37/21) / (2 (18.5/21)(2.5/21)) = -16/21 * 441/92.5,
    # the allocation's shift g n/(n+1) p(1-p)/n = g * 20/21 * 0.0045.
    g2 = (1 - 37 / 21) / (2 * (18.5 / 21) * (2.5 / 21))
    now = 0.25 * 0.5 + 0.75 * (0.9 + g2 * 20 / 21 * 0.0045)
    assert now == pytest.approx(0.788325, abs=1e-6)
    iv = wilson_interval(N2, n2, h2, 0.95, fpc=False)
    assert float(iv.estimate) == pytest.approx(now, rel=1e-12)
    # at the stop, the stopping rule's term too: W_k^2 (1 - 2 pbar_k) / (n_k v) of p(1-p)/n
    v = float(iv.stderr) ** 2
    stop = 0.75 * (0.9 + (g2 * 20 / 21 + 0.75**2 * (1 - 37 / 21) / (20 * v)) * 0.0045) + 0.125
    assert float(iv.estimate_at_stop) == pytest.approx(stop, rel=1e-12)
    # and neither is the interval's centre, shrunk toward 1/2
    assert (iv.lower + iv.upper) / 2 < iv.estimate_at_stop < iv.estimate


def test_wilson_not_adaptive_is_around_the_plain_estimate():
    # simple random sampling at a fixed n: no adaptive term, the plain proportion reported
    iv = wilson_interval([10**6], [100], [97], 0.95, fpc=False, adaptive=False)
    assert float(iv.estimate) == float(iv.estimate_at_stop) == 0.97
    var = 100 / 99 * (97.5 / 101) * (3.5 / 101) / 100  # the half-label guard
    lo, hi = textbook_wilson(0.97, 0.97 * 0.03 / (STOPPING_VARIANCE_MARGIN * var), Z95)
    assert (float(iv.lower), float(iv.upper)) == (pytest.approx(lo, abs=1e-12), pytest.approx(hi, abs=1e-12))


def test_wilson_nan_bounds_without_two_labels_per_stratum():
    for n, h in (([0, 20], [0, 18]), ([1, 20], [1, 18])):
        iv = wilson_interval([100, 300], n, h, fpc=False)
        assert np.isnan(iv.lower) and np.isnan(iv.upper) and np.isnan(iv.halfwidth)


@PROPS
@given(st.lists(st.tuples(st.integers(1, 10_000), st.integers(2, 300), st.floats(0, 1)), min_size=1, max_size=6),
       st.sampled_from([0.8, 0.9, 0.95, 0.99]), st.booleans())
def test_wilson_limits_in_unit_interval_and_contain_estimate(strata, confidence, fpc):
    N = np.array([s[0] for s in strata])
    n = np.array([min(s[1], s[0]) if fpc else s[1] for s in strata])
    h = np.floor(np.array([s[2] for s in strata]) * n)
    iv = wilson_interval(N, n, h, confidence, fpc)
    assert np.isfinite(iv.lower) and np.isfinite(iv.upper)
    assert 0.0 <= iv.lower <= iv.upper <= 1.0
    # contains the estimate (up to rounding: with h = 0 the computed lower
    # limit can be 1e-17 instead of 0; reported, harmless)
    assert iv.lower - 1e-12 <= iv.estimate <= iv.upper + 1e-12
    wider = wilson_interval(N, n, h, min(confidence + 0.005, 0.999), fpc)
    assert wider.lower <= iv.lower + 1e-12 and wider.upper >= iv.upper - 1e-12


def test_wilson_is_vectorised_over_runs():
    n = np.array([[10, 20], [4, 4], [0, 3]])
    h = np.array([[5, 18], [4, 4], [0, 1]])
    iv = wilson_interval(N2, n, h)
    assert iv.lower.shape == (3,)
    one = wilson_interval(N2, n[0], h[0])
    assert iv.lower[0] == pytest.approx(float(one.lower)) and np.isnan(iv.lower[2])


def test_interval_dispatch_and_unknown_method():
    a = interval(N2, n2, h2, 0.95, "wilson", fpc=False)
    b = wilson_interval(N2, n2, h2, 0.95, fpc=False)
    assert (a.lower, a.upper) == (b.lower, b.upper)
    c = interval(N2, n2, h2, 0.95, "normal", fpc=False)
    assert c.upper == normal_interval(N2, n2, h2, 0.95, fpc=False).upper
    with pytest.raises(ValueError, match="interval must be one of"):
        interval(N2, n2, h2, 0.95, "wald")


def test_wilson_covers_at_least_nearly_nominally_in_a_seeded_simulation():
    # 2000 runs, 3 strata, 8 labels each: coverage of a 95% interval
    N, P, n = [500, 300, 200], [0.6, 0.9, 0.98], [8, 8, 8]
    h = _binomial_runs(N, P, n, 2000, seed=5)
    iv = wilson_interval(N, n, h, 0.95, fpc=False)
    truth = float(np.dot(weights(N), P))
    coverage = np.mean((iv.lower <= truth) & (truth <= iv.upper))
    assert coverage >= 0.92


def test_the_reported_estimate_never_leaves_its_interval():
    """An interval with no width at 1.0 (an infinite effective sample) and the reading without the
    stopping term a rounding error below it (seen in tests/e2e/test_ops.py): reported as 1.0."""
    from stratameter.stats.estimator import wilson_score

    iv = wilson_score(np.asarray(1.0), np.asarray(np.inf), Z95, np.asarray(True), np.asarray(1.0),
                      np.asarray(0.0), np.asarray(0.9999999999999999))
    assert float(iv.lower) == float(iv.upper) == 1.0
    assert float(iv.estimate) == 1.0 and float(iv.estimate_at_stop) == 1.0
