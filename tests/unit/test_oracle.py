"""The oracles (service/stats/oracle.py), Neyman's and the Jeffreys oracle: hand cases and properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import binom, hypergeom

from stratameter.stats.estimator import half_label_smoothed, stratified_variance, z_value
from stratameter.stats.oracle import (expected_jeffreys_variance, jeffreys_oracle_allocation, jeffreys_oracle_labels,
                                      neyman_oracle_labels)

Z95 = 1.959963984540054  # Phi^-1(0.975)


# ---------------------------------------------------------------- Neyman oracle


def test_neyman_oracle_labels_hand_case():
    # W = (0.5, 0.5), S = (sqrt(.25), sqrt(.09)) = (0.5, 0.3): sum W S = 0.4
    got = neyman_oracle_labels([1000, 1000], [0.5, 0.9], 0.05)
    assert got == pytest.approx(Z95**2 * 0.4**2 / 0.05**2, rel=1e-12)
    assert got == pytest.approx(245.853, abs=1e-3)


def test_neyman_oracle_labels_fpc_hand_case():
    # n = (sum W S)^2 / (delta^2/z^2 + sum W S^2 / N), sum W S^2 = 0.17, N = 2000
    got = neyman_oracle_labels([1000, 1000], [0.5, 0.9], 0.05, fpc=True)
    want = 0.4**2 / (0.05**2 / Z95**2 + 0.17 / 2000)
    assert got == pytest.approx(want, rel=1e-12)
    assert got == pytest.approx(217.45, abs=0.01)
    assert got < neyman_oracle_labels([1000, 1000], [0.5, 0.9], 0.05)


def test_neyman_oracle_labels_single_stratum_is_simple_random_sampling():
    assert neyman_oracle_labels([10], [0.8], 0.01, 0.95) == pytest.approx(Z95**2 * 0.16 / 1e-4)
    assert neyman_oracle_labels([10, 20], [1.0, 0.0], 0.01) == 0.0  # pure strata: nothing to learn


@pytest.mark.parametrize("delta", [0.0, -0.01])
def test_neyman_oracle_labels_bad_delta(delta):
    with pytest.raises(ValueError, match="delta must be > 0"):
        neyman_oracle_labels([10, 10], [0.5, 0.5], delta)


# ---------------------------------------------------------------- Jeffreys oracle


def test_expected_variance_hand_case():
    # One stratum, P = 1/2, n = 3: h = 0..3 with weights 1,3,3,1 / 8, smoothed
    # p = (h + 1/2)/4, p(1-p) = 7/64, 15/64, 15/64, 7/64 -> mean 13/64;
    # v = n/(n-1) * mean / n = 13/128.
    assert expected_jeffreys_variance([100], [0.5], [3])[0] == pytest.approx(13 / 128, rel=1e-12)


@pytest.mark.parametrize("fpc", [False, True])
@pytest.mark.parametrize("N,P,n", [(40, 0.9, 7), (40, 1.0, 5), (25, 0.3, 12), (200, 0.97, 30)])
def test_expected_variance_equals_exact_expectation_of_the_interval_variance(N, P, n, fpc):
    """Enumerate every label outcome and average the variance the interval uses."""
    h = np.arange(n + 1)
    G = round(P * N)
    pmf = hypergeom(N, G, n).pmf(h) if fpc else binom(n, G / N).pmf(h)
    v = stratified_variance(np.full(h.size, N)[:, None], np.full(h.size, n)[:, None], h[:, None], fpc=fpc,
                            p_var=half_label_smoothed(n, h)[:, None])
    want = float(np.sum(pmf * v))
    got = expected_jeffreys_variance([N], [G / N], [n], fpc)[0]
    assert got == pytest.approx(want, rel=1e-10)


def test_single_stratum_solves_the_closed_form_equation():
    # K = 1, P = 1/2: E[v](n) = (n^2 + n + 1) / (4 (n-1) (n+1)^2) = (delta/z)^2.
    delta = 0.05
    target = (delta / z_value(0.95)) ** 2
    want = brentq(lambda n: (n * n + n + 1) / (4 * (n - 1) * (n + 1) ** 2) - target, 2.0, 1e6)
    assert jeffreys_oracle_labels([1000], [0.5], delta) == pytest.approx(want, rel=1e-6)
    assert want == pytest.approx(384.15, abs=0.01)


def test_pure_stratum_still_needs_labels():
    # P = 1: E[v](n) = (n/2 + 1/4) / ((n-1)(n+1)^2) ~ 1/(2 n^2), so n ~ z / (delta sqrt 2).
    delta = 0.01
    target = (delta / z_value(0.95)) ** 2
    want = brentq(lambda n: (n / 2 + 0.25) / ((n - 1) * (n + 1) ** 2) - target, 2.0, 1e6)
    assert jeffreys_oracle_labels([1000], [1.0], delta) == pytest.approx(want, rel=1e-6)
    assert neyman_oracle_labels([1000], [1.0], delta) == 0.0


def test_two_label_minimum_when_the_target_is_loose():
    assert jeffreys_oracle_allocation([10, 0, 30], [0.5, 0.7, 0.9], 0.9).tolist() == pytest.approx([2, 0, 2])


@pytest.mark.slow
def test_fpc_never_asks_for_more_than_the_stratum():
    alloc = jeffreys_oracle_allocation([50, 5000], [0.5, 0.5], 0.01, fpc=True)
    assert alloc[0] <= 50 + 1e-9
    assert alloc.sum() < jeffreys_oracle_labels([50, 5000], [0.5, 0.5], 0.01)


@pytest.mark.parametrize("delta", [0.0, -0.1])
def test_bad_delta(delta):
    with pytest.raises(ValueError, match="delta must be > 0"):
        jeffreys_oracle_labels([10], [0.5], delta)


@pytest.mark.parametrize("p", [[1.2], [-0.1], [float("nan")]])
def test_bad_precision(p):
    with pytest.raises(ValueError, match="precisions must be in"):
        jeffreys_oracle_labels([10], p, 0.05)


def test_empty_population():
    with pytest.raises(ValueError, match="empty"):
        jeffreys_oracle_labels([0, 0], [0.5, 0.5], 0.05)


strata = st.lists(st.tuples(st.integers(1, 10**6), st.floats(0.0, 1.0)), min_size=1, max_size=6)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(strata, st.floats(0.005, 0.1))
def test_optimal_feasible_and_above_neyman(rows, delta):
    N = np.array([r[0] for r in rows], float)
    P = np.array([r[1] for r in rows])
    alloc = jeffreys_oracle_allocation(N, P, delta)
    target = (delta / z_value(0.95)) ** 2
    v = expected_jeffreys_variance(N, P, alloc).sum()
    assert np.all(alloc >= 2 - 1e-9)
    assert v <= target * (1 + 1e-6)
    # above the two-label minimum the constraint binds: no labels are left unused
    if alloc.sum() > 2 * N.size + 1e-6:
        assert v == pytest.approx(target, rel=1e-4)
    # moving one label between two strata above the minimum never lowers the variance
    for i in range(N.size):
        for j in range(N.size):
            if i != j and alloc[i] > 3:
                moved = alloc.copy()
                moved[i] -= 1
                moved[j] += 1
                assert expected_jeffreys_variance(N, P, moved).sum() >= v * (1 - 1e-3)
    assert alloc.sum() >= neyman_oracle_labels(N, P, delta) * (1 - 1e-6)  # the honest floor is never below Neyman's
