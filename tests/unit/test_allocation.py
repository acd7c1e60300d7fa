"""Unit and property tests of the label allocation (service/stats/allocation.py).

The default method (``opt_track``) and its constants are being tuned elsewhere:
it is only held to the public contract shared by every method (non-negative
integers, the round size, caps without replacement, no labels for empty strata,
determinism); its constants are imported, never restated.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratameter.stats.allocation import (
    ALLOCATIONS,
    DEFAULT_ALLOCATION,
    MIN_LABELS_PER_STRATUM,
    PSEUDO_WEIGHT,
    allocate,
    allocate_opt_track,
    largest_remainder,
    neyman_shares,
    pseudo_smoothed,
    round_size,
)

PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


@st.composite
def states(draw, with_replacement: bool, min_labels: int = 0):
    """State of `runs` runs over K strata: N (shared), n, h (per run), q."""
    k = draw(st.integers(1, 6))
    runs = draw(st.integers(1, 4))
    N = np.array(draw(st.lists(st.integers(0, 400), min_size=k, max_size=k)))
    if N.sum() == 0:
        N[draw(st.integers(0, k - 1))] = draw(st.integers(1, 400))
    n = np.zeros((runs, k), dtype=np.int64)
    h = np.zeros((runs, k), dtype=np.int64)
    for r in range(runs):
        for j in range(k):
            if N[j] == 0:
                continue  # nothing to label in an empty stratum
            top = 60 if with_replacement else int(N[j])
            n[r, j] = draw(st.integers(min(min_labels, top), top))
            h[r, j] = draw(st.integers(0, int(n[r, j])))
    # q strictly inside (0, 1): q = 0 or 1 with pure labels is the degenerate
    # all-zero-shares case, tested by hand below
    q = np.array(draw(st.lists(st.floats(0.01, 0.99), min_size=k, max_size=k)))
    D = draw(st.integers(1, 40))
    round_index = draw(st.integers(0, 4))
    seed = draw(st.integers(0, 2**32 - 1))
    return N, n, h, q, D, round_index, seed


def run(method, N, n, h, q, D, round_index, seed, with_replacement):
    return allocate(method, N=N, n=n, h=h, q=q, D=D, round_index=round_index, rng=rng(seed),
                    with_replacement=with_replacement, first=(n, h))


# ---------------------------------------------------------------- small pieces


def test_round_size():
    assert round_size(4) == 8
    assert round_size(1) == 2
    assert round_size(3, per_stratum=5) == 15
    assert round_size(0) == 1


def test_largest_remainder_hand_cases():
    # exact 3.5, 2.1, 1.4 -> floors 3, 2, 1 -> the 0.5 remainder gets the last one
    assert largest_remainder([0.5, 0.3, 0.2], 7).tolist() == [4, 2, 1]
    # equal shares: ties broken by position
    assert largest_remainder([1, 1, 1], 10).tolist() == [4, 3, 3]
    # all-zero shares are split evenly
    assert largest_remainder([0, 0, 0], 5).tolist() == [2, 2, 1]
    # unnormalised shares are fine
    assert largest_remainder([100, 300], 8).tolist() == [2, 6]
    # rows with their own totals
    got = largest_remainder([[1, 3], [1, 1], [0, 0]], [4, 5, 3])
    assert got.tolist() == [[1, 3], [3, 2], [2, 1]]


@PROPS
@given(st.lists(st.floats(0, 1e6), min_size=1, max_size=8), st.integers(0, 10_000))
def test_largest_remainder_sums_exactly_and_stays_within_one_of_the_quota(shares, total):
    got = largest_remainder(shares, total)
    assert got.dtype.kind == "i" and got.sum() == total and np.all(got >= 0)
    s = np.array(shares)
    quota = total * (s / s.sum() if s.sum() > 0 else np.full(s.size, 1 / s.size))
    assert np.all(np.abs(got - quota) < 1.0 + 1e-9)


def test_neyman_shares_hand_case():
    # N_k sqrt(p_k (1 - p_k)): 100 * 0.5, 300 * 0.3
    np.testing.assert_allclose(neyman_shares([100, 300], [0.5, 0.9]), [50.0, 90.0])
    np.testing.assert_allclose(neyman_shares([100, 300], [0.0, 1.0]), [0.0, 0.0])


def test_pseudo_smoothed_hand_cases():
    # (h + w q) / (n + w)
    assert pseudo_smoothed(10, 5, 0.9, weight=10.0) == pytest.approx((5 + 9) / 20)
    assert pseudo_smoothed(10, 5, 0.9, weight=4.0) == pytest.approx((5 + 3.6) / 14)
    assert pseudo_smoothed(0, 0, 0.8, weight=10.0) == pytest.approx(0.8)  # no labels: the score's word
    assert pseudo_smoothed(8, 2, 0.9, weight=0.0) == pytest.approx(0.25)  # no pseudo-observations
    # q is clipped into [0, 1]
    assert pseudo_smoothed(10, 5, 1.7, weight=10.0) == pytest.approx(pseudo_smoothed(10, 5, 1.0, weight=10.0))
    assert pseudo_smoothed(10, 5, -3.0, weight=10.0) == pytest.approx(0.25)
    np.testing.assert_allclose(pseudo_smoothed([0, 10], [0, 5], [0.5, 0.9], weight=10.0), [0.5, 0.7])
    # the default weight is the module's constant (whatever it is tuned to)
    assert pseudo_smoothed(10, 5, 0.9) == pytest.approx((5 + PSEUDO_WEIGHT * 0.9) / (10 + PSEUDO_WEIGHT))


# ---------------------------------------------------------------- contract of every method


@pytest.mark.parametrize("method", ALLOCATIONS)
@PROPS
@given(data=st.data())
def test_every_method_returns_nonnegative_ints_of_the_right_shape(method, data):
    wr = data.draw(st.booleans(), label="with_replacement")
    N, n, h, q, D, r, seed = data.draw(states(wr))
    got = run(method, N, n, h, q, D, r, seed, wr)
    assert got.shape == n.shape
    assert got.dtype.kind == "i"
    assert np.all(got >= 0)
    if method in ("opt_a1", "opt_a2") and r == 0:
        assert np.all(got <= 5)  # n_ini per stratum
    else:
        assert np.all(got.sum(axis=-1) <= D)
    if not wr:
        assert np.all(got <= N - n)  # never more than the unlabelled items
        # a short round only when the whole population is labelled: labels a
        # full stratum cannot take go to the strata with room
        room = np.maximum(N - n, 0)
        if method in ("opt_a1", "opt_a2") and r == 0:  # n_ini per stratum, all of a smaller one
            assert np.array_equal(got, np.minimum(np.where(N > 0, 5, 0), room))
        else:
            short = got.sum(axis=-1) < D
            exhausted = (got == room).all(axis=-1)
            assert np.all(~short | exhausted)
    # no labels for a stratum with no items
    assert np.all(got[..., N == 0] == 0)


@pytest.mark.parametrize("method", ALLOCATIONS)
@PROPS
@given(data=st.data())
def test_with_replacement_rows_sum_to_D(method, data):
    N, n, h, q, D, r, seed = data.draw(states(True))
    r = max(r, 1)  # opt_a1's and opt_a2's round 0 is n_ini per stratum instead
    got = run(method, N, n, h, q, D, r, seed, True)
    assert np.all(got.sum(axis=-1) == D)


def test_default_method_warm_up_round_still_sums_to_D():
    k = 3
    n = [MIN_LABELS_PER_STRATUM] * (k - 1) + [0]  # one stratum still lacks its first labels
    D = MIN_LABELS_PER_STRATUM * k + 1
    got = allocate(DEFAULT_ALLOCATION, N=[100, 200, 300], n=n, h=[0] * k, q=[0.5, 0.7, 0.9], D=D,
                   round_index=1, rng=rng())
    assert got.sum() == D


def test_all_pure_strata_give_no_labels_to_empty_strata():
    # the seed is fixed: with an even split over 3 strata, stratum 0 gets labels
    got = allocate("opt_conf", N=[0, 100, 300], n=[0, 5, 5], h=[0, 5, 5], q=[1.0, 1.0, 1.0], D=6,
                   round_index=3, rng=rng())
    assert got[0] == 0 and got.sum() == 6


@pytest.mark.parametrize("method", ALLOCATIONS)
def test_all_pure_strata_every_method_skips_empty_strata(method):
    got = allocate(method, N=[0, 100, 300], n=[0, 5, 5], h=[0, 5, 5], q=[1.0, 1.0, 1.0], D=6,
                   round_index=3, rng=rng(), first=([0, 5, 5], [0, 5, 5]))
    assert got[0] == 0 and got.sum() == 6


@PROPS
@given(states(True, min_labels=MIN_LABELS_PER_STRATUM))
def test_default_method_sums_to_D_once_every_stratum_has_its_first_labels(state):
    N, n, h, q, D, r, seed = state
    got = run(DEFAULT_ALLOCATION, N, n, h, q, D, r, seed, True)
    assert np.all(got.sum(axis=-1) == D)
    assert np.all(got[..., N == 0] == 0)


@PROPS
@given(states(True), st.integers(0, 2**32 - 1))
def test_default_method_is_deterministic(state, other_seed):
    N, n, h, q, D, r, seed = state
    a = run(DEFAULT_ALLOCATION, N, n, h, q, D, r, seed, True)
    b = run(DEFAULT_ALLOCATION, N, n, h, q, D, r, other_seed, True)
    np.testing.assert_array_equal(a, b)


def test_without_replacement_caps_at_the_unlabelled_items_hand_case():
    got = allocate("pps", N=[3, 100], n=[2, 0], h=[1, 0], D=40, round_index=1, rng=rng(),
                   with_replacement=False)
    assert got[0] <= 1 and got[1] <= 100
    full = allocate("uni", N=[3, 5], n=[3, 5], h=[1, 2], D=4, round_index=1, rng=rng(), with_replacement=False)
    assert full.tolist() == [0, 0]  # everything labelled: nothing left to allocate


@pytest.mark.parametrize("method", ALLOCATIONS)
def test_without_replacement_labels_go_where_there_is_room(method):
    # stratum 0 (3 items) is fully labelled, stratum 1 has 950 unlabelled items
    got = allocate(method, N=[3, 1000], n=[3, 50], h=[1, 50], q=[0.5, 0.9], D=4, round_index=3,
                   rng=rng(), with_replacement=False, first=([3, 5], [1, 5]))
    assert got.sum() == 4


def test_opt_track_takes_no_stratum_past_its_capacity_hand_case():
    """Two equal strata of 1000 items at p = 1/2, 10 labels each, a round of 20: Neyman's split is
    10 + 10; with stratum 0's capacity 12 (its reservoir) it takes 2 and stratum 1 the other 18."""
    N, n, h, q = [1000.0, 1000.0], [10.0, 10.0], [5.0, 5.0], [0.5, 0.5]
    assert allocate_opt_track(N, n, h, q, 20, with_replacement=False).tolist() == [10, 10]
    assert allocate_opt_track(N, n, h, q, 20, with_replacement=False, capacity=[12, 1000]).tolist() == [2, 18]
    assert allocate_opt_track(N, n, h, q, 20, with_replacement=False, capacity=[10, 10]).tolist() == [0, 0]


def test_opt_a2_round_zero_skips_empty_strata():
    got = allocate("opt_a2", N=[0, 1000], n=[0, 0], h=[0, 0], D=4, round_index=0, rng=rng())
    assert got[0] == 0


# ---------------------------------------------------------------- method by method


def test_opt_multinomial_expectation_matches_neyman_shares_on_bennett_estimates():
    N, n, h = np.array([100, 300, 600]), np.array([10, 20, 5]), np.array([5, 18, 1])
    # Bennett & Carvalho's m-estimates by hand: (h + m/2) / (n + m), m = 1/sqrt(n)
    m = 1 / np.sqrt(n)
    p = (h + m / 2) / (n + m)
    share = N * np.sqrt(p * (1 - p))
    share = share / share.sum()
    runs, D = 20_000, 10
    got = allocate("opt", N=N, n=np.broadcast_to(n, (runs, 3)), h=np.broadcast_to(h, (runs, 3)),
                   D=D, round_index=1, rng=rng(3))
    assert np.all(got.sum(axis=1) == D)
    mean = got.mean(axis=0) / D
    se = np.sqrt(share * (1 - share) / (D * runs))
    assert np.all(np.abs(mean - share) < 4 * se), (mean, share)


def test_opt_conf_expectation_matches_neyman_shares_on_pseudo_smoothed_estimates():
    N, n, h, q = np.array([100, 300]), np.array([4, 6]), np.array([4, 3]), np.array([0.95, 0.6])
    p = (h + PSEUDO_WEIGHT * q) / (n + PSEUDO_WEIGHT)
    share = N * np.sqrt(p * (1 - p))
    share = share / share.sum()
    runs, D = 20_000, 8
    got = allocate("opt_conf", N=N, n=np.broadcast_to(n, (runs, 2)), h=np.broadcast_to(h, (runs, 2)),
                   q=q, D=D, round_index=1, rng=rng(4))
    mean = got.mean(axis=0) / D
    se = np.sqrt(share * (1 - share) / (D * runs))
    assert np.all(np.abs(mean - share) < 4 * se), (mean, share)


def test_opt_with_no_labels_is_neyman_at_the_prior():
    # n = 0 everywhere: every p_k = 0.5, so the shares are proportional to N
    runs, D = 20_000, 4
    got = allocate("opt", N=[100, 300], n=np.zeros((runs, 2), int), h=np.zeros((runs, 2), int), D=D,
                   round_index=0, rng=rng(5))
    assert got.mean(axis=0) / D == pytest.approx([0.25, 0.75], abs=0.01)


def test_opt_a2_round_zero_gives_n_ini_each():
    got = allocate("opt_a2", N=[100, 300, 50], n=[0, 0, 0], h=[0, 0, 0], D=4, round_index=0, rng=rng())
    assert got.tolist() == [5, 5, 5]
    got = allocate("opt_a2", N=[100, 300], n=np.zeros((3, 2), int), h=np.zeros((3, 2), int), D=4,
                   round_index=0, rng=rng(), n_ini=3)
    assert got.tolist() == [[3, 3]] * 3
    capped = allocate("opt_a2", N=[2, 300], n=[0, 0], h=[0, 0], D=4, round_index=0, rng=rng(),
                      with_replacement=False)
    assert capped.tolist() == [2, 5]


def test_opt_a2_later_round_hand_cases():
    # s_k^2 = n/(n-1) p(1-p): p = (0.2, 0.4) -> (0.2, 0.3); shares 100 sqrt(.2), 300 sqrt(.3)
    # = 44.72, 164.32 -> 2.139, 7.861 of 10 -> floors 2, 7, the larger remainder gets 1
    got = allocate("opt_a2", N=[100, 300], n=[5, 5], h=[1, 2], D=10, round_index=1, rng=rng())
    assert got.tolist() == [2, 8]
    # a pure stratum has s_k = 0 and gets nothing (Kumar & Raj's rule)
    got = allocate("opt_a2", N=[100, 100], n=[5, 5], h=[2, 5], D=6, round_index=1, rng=rng())
    assert got.tolist() == [6, 0]
    # every stratum pure: proportional to N
    got = allocate("opt_a2", N=[100, 300], n=[5, 5], h=[5, 0], D=8, round_index=1, rng=rng())
    assert got.tolist() == [2, 6]


def test_opt_a1_allocates_by_the_first_labels_alone():
    """Kumar & Raj (Alg. 1): the shares come from the labels after round 0 and never move."""
    assert allocate("opt_a1", N=[100, 300, 50], n=[0, 0, 0], h=[0, 0, 0], D=4, round_index=0,
                    rng=rng()).tolist() == [5, 5, 5]
    first = (np.array([5, 5]), np.array([1, 2]))  # s_k^2 = (0.2, 0.3): shares 0.2139, 0.7861 (as opt_a2 above)
    got = allocate("opt_a1", N=[100, 300], n=[5, 5], h=[1, 2], D=10, round_index=1, rng=rng(), first=first)
    assert got.tolist() == [2, 8]
    # later labels say both strata are pure: opt_a2 would split proportionally (2.5, 7.5),
    # opt_a1 keeps the first shares: beyond the first 5 each, target 20 x (0.2139, 0.7861) = (4.28, 15.72)
    got = allocate("opt_a1", N=[100, 300], n=[7, 13], h=[7, 0], D=10, round_index=2, rng=rng(), first=first)
    assert got.tolist() == [2, 8]
    assert allocate("opt_a2", N=[100, 300], n=[7, 13], h=[7, 0], D=10, round_index=2, rng=rng()).tolist() == [3, 7]
    # over many rounds the labels beyond the first stay within a label of the frozen shares
    n, h = first[0].copy(), first[1].copy()
    for r in range(1, 40):
        n += allocate("opt_a1", N=[100, 300], n=n, h=h, D=3, round_index=r, rng=rng(), first=first)
        assert np.all(np.abs((n - 5) - (n.sum() - 10) * np.array([0.21393, 0.78607])) <= 1.0 + 1e-3)
    with pytest.raises(ValueError, match="opt_a1.*first"):
        allocate("opt_a1", N=[100, 300], n=[5, 5], h=[1, 2], D=10, round_index=1, rng=rng())


def test_pps_tracks_cumulative_proportional_targets():
    N = [100, 300]
    assert allocate("pps", N=N, n=[0, 0], h=[0, 0], D=4, round_index=0, rng=rng()).tolist() == [1, 3]
    assert allocate("pps", N=N, n=[1, 3], h=[0, 0], D=4, round_index=1, rng=rng()).tolist() == [1, 3]
    # behind on stratum 1: target (4 + 4) * (1/4, 3/4) = (2, 6), deficits (0, 5) -> all 4 there
    assert allocate("pps", N=N, n=[3, 1], h=[0, 0], D=4, round_index=1, rng=rng()).tolist() == [0, 4]
    # over many rounds the cumulative counts stay within a label of W_k * n
    n = np.zeros(3, int)
    for r in range(50):
        n += allocate("pps", N=[50, 30, 20], n=n, h=np.zeros(3, int), D=3, round_index=r, rng=rng())
        assert np.all(np.abs(n - n.sum() * np.array([0.5, 0.3, 0.2])) <= 1.0 + 1e-9)


def test_uni_tracks_cumulative_equal_targets():
    N = [100, 300, 50]
    assert allocate("uni", N=N, n=[0, 0, 0], h=[0, 0, 0], D=6, round_index=0, rng=rng()).tolist() == [2, 2, 2]
    # target (6 + 6) / 3 = 4 each; deficits (0, 4, 2)
    assert allocate("uni", N=N, n=[4, 0, 2], h=[0, 0, 0], D=6, round_index=1, rng=rng()).tolist() == [0, 4, 2]
    # an empty stratum is not part of the split
    assert allocate("uni", N=[100, 0, 50], n=[0, 0, 0], h=[0, 0, 0], D=4, round_index=0,
                    rng=rng()).tolist() == [2, 0, 2]


def test_random_is_one_stratum_simple_random_sampling():
    got = allocate("random", N=[5000], n=np.zeros((4, 1), int), h=np.zeros((4, 1), int), D=2,
                   round_index=0, rng=rng())
    assert got.tolist() == [[2]] * 4


# ---------------------------------------------------------------- bad input


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="allocation must be one of"):
        allocate("neyman", N=[1, 2], n=[0, 0], h=[0, 0], q=[0.5, 0.5], D=4, round_index=0, rng=rng())


@pytest.mark.parametrize("D", [0, -3])
@pytest.mark.parametrize("method", ALLOCATIONS)
def test_round_size_below_one_raises(method, D):
    with pytest.raises(ValueError, match="round size must be >= 1"):
        allocate(method, N=[1, 2], n=[0, 0], h=[0, 0], q=[0.5, 0.5], D=D, round_index=1, rng=rng())


@pytest.mark.parametrize("method", ["opt_conf", "opt_track"])
def test_methods_using_scores_require_q(method):
    with pytest.raises(ValueError, match=r"needs the calibrated mean score per stratum \(q\)"):
        allocate(method, N=[1, 2], n=[0, 0], h=[0, 0], D=4, round_index=1, rng=rng())


def test_methods_not_using_scores_do_not_require_q():
    for method in ("opt", "opt_a2", "pps", "uni", "random"):
        got = allocate(method, N=[10, 20], n=[3, 3], h=[1, 2], D=4, round_index=1, rng=rng())
        assert got.sum() == 4


def test_shares_are_not_a_function_of_the_run_count():
    # a batch of identical runs gives each run what a single run gets (deterministic methods)
    for method in ("opt_a2", "pps", "uni", DEFAULT_ALLOCATION):
        one = allocate(method, N=[100, 300, 60], n=[6, 3, 2], h=[3, 3, 0], q=[0.6, 0.9, 0.5], D=7,
                       round_index=2, rng=rng())
        many = allocate(method, N=[100, 300, 60], n=np.tile([6, 3, 2], (5, 1)), h=np.tile([3, 3, 0], (5, 1)),
                        q=[0.6, 0.9, 0.5], D=7, round_index=2, rng=rng())
        assert many.tolist() == [one.tolist()] * 5, method
