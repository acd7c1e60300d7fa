"""Unit and property tests of the score sketch (service/stats/sketch.py) and the
stratification built on it (service/stats/strata.py).

Hand-computed cases use the grid's definition: bucket ``b`` of ``BINS = 4096``
covers ``u in [(b - 2048)/2048, (b - 2047)/2048)`` on the squashed scale
``u = s / (1 + |s|)``, so for ``b = 2048 + j`` (j >= 0) its lower edge in score
units is ``s = u / (1 - u) = j / (2048 - j)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from stratameter.stats.sketch import (
    BINS,
    ScoreHistogram,
    bin_edges_score,
    bin_index,
    require_finite,
    squash,
    unsquash,
)
from stratameter.stats.strata import STRATIFICATIONS, assign, boundaries, stratify

PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

finite = st.floats(min_value=-1e300, max_value=1e300, allow_nan=False, allow_infinity=False)
moderate = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


def edge(j: int) -> float:
    """Lower edge (score units) of bucket 2048 + j, by hand: j / (2048 - j)."""
    return j / (2048 - j)


@st.composite
def score_samples(draw):
    """Score vectors with heavy ties: a few distinct values (anything from tiny
    to huge, probabilities, logits), each repeated, optionally plus a dense
    continuous part."""
    values = draw(st.lists(st.one_of(finite, st.floats(0, 1), moderate,
                                     st.sampled_from([0.0, 0.5, 1.0, -1e-200, 1e-200])),
                           min_size=1, max_size=8))
    picks = draw(st.lists(st.integers(0, len(values) - 1), min_size=1, max_size=200))
    scores = np.array([values[i] for i in picks], dtype=float)
    if draw(st.booleans()):
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        scores = np.concatenate([scores, rng.beta(2.0, 1.0, draw(st.integers(1, 2000)))])
    return scores


# ---------------------------------------------------------------- squash / buckets


def test_squash_hand_values():
    np.testing.assert_allclose(squash([-3.0, -1.0, 0.0, 1.0, 3.0]), [-0.75, -0.5, 0.0, 0.5, 0.75])
    np.testing.assert_allclose(unsquash([-0.75, -0.5, 0.0, 0.5, 0.75]), [-3.0, -1.0, 0.0, 1.0, 3.0])


@PROPS
@given(st.lists(moderate, min_size=1, max_size=50))
def test_unsquash_inverts_squash(xs):
    x = np.array(xs)
    u = squash(x)
    assert np.all(np.abs(u) < 1.0)
    np.testing.assert_allclose(unsquash(u), x, rtol=1e-9, atol=1e-12)


@PROPS
@given(st.lists(st.floats(-0.999999, 0.999999), min_size=1, max_size=50))
def test_squash_inverts_unsquash(us):
    u = np.array(us)
    np.testing.assert_allclose(squash(unsquash(u)), u, rtol=1e-9, atol=1e-12)


@PROPS
@given(st.lists(finite, min_size=1, max_size=100))
def test_bin_index_in_range_monotone_and_inside_its_edges(xs):
    x = np.sort(np.array(xs))
    b = bin_index(x)
    assert b.dtype == np.int64
    assert b.min() >= 0 and b.max() <= BINS - 1
    assert np.all(np.diff(b) >= 0)
    edges = bin_edges_score()
    assert np.all(edges[b] <= x) and np.all(x < edges[b + 1])


def test_bin_index_extremes_and_hand_buckets():
    assert bin_index(np.array([-1e308, 1e308])).tolist() == [0, BINS - 1]
    # 0 is the lower edge of bucket 2048; 1 (u = 1/2) the lower edge of 3072.
    assert bin_index(np.array([0.0, 1.0])).tolist() == [2048, 3072]
    assert bin_index(np.array([edge(1) / 2, edge(3) + 1e-12])).tolist() == [2048, 2051]


def test_bin_index_tiny_negative_scores_stay_below_zero_edge():
    # Regression: floor((u + 1) * BINS/2) rounds u + 1 to 1 for u = -1e-200
    # and used to put the score into bucket 2048, whose lower edge is 0 > score.
    assert bin_index(np.array([-1e-200, -1e-17, 1e-200])).tolist() == [2047, 2047, 2048]


def test_bin_index_puts_every_edge_and_its_neighbours_in_the_bucket_that_holds_them():
    edges = bin_edges_score()
    inner = edges[1:-1]
    for x in (inner, np.nextafter(inner, np.inf), np.nextafter(inner, -np.inf)):
        b = bin_index(x)
        assert np.all(edges[b] <= x) and np.all(x < edges[b + 1])
    assert bin_index(inner).tolist() == list(range(1, BINS))


def test_bin_edges_score_shape_and_order():
    e = bin_edges_score()
    assert e.shape == (BINS + 1,)
    assert e[0] == -np.inf and e[-1] == np.inf
    assert np.all(np.diff(e) > 0)
    assert e[2048] == 0.0 and e[3072] == 1.0 and e[1024] == -1.0
    assert math.isclose(e[2049], edge(1))
    e[5] = 123.0  # a copy: the module's grid is not mutable from outside
    assert bin_edges_score()[5] != 123.0


# ---------------------------------------------------------------- histogram


def test_histogram_counts_min_max_and_empty_add():
    h = ScoreHistogram.from_scores(np.array([0.2, 0.2, -3.0, 7.5]))
    assert h.total == 4
    assert (h.min, h.max) == (-3.0, 7.5)
    assert h.counts[bin_index(np.array([0.2]))[0]] == 2
    h.add(np.array([]))
    assert h.total == 4 and (h.min, h.max) == (-3.0, 7.5)
    empty = ScoreHistogram()
    assert empty.total == 0 and empty.sparse() == {}


@PROPS
@given(st.lists(finite, max_size=80), st.lists(finite, max_size=80))
def test_merge_equals_histogram_of_concatenation(a, b):
    a, b = np.array(a, dtype=float), np.array(b, dtype=float)
    merged = ScoreHistogram.from_scores(a).merge(ScoreHistogram.from_scores(b))
    whole = ScoreHistogram.from_scores(np.concatenate([a, b]))
    np.testing.assert_array_equal(merged.counts, whole.counts)
    assert (merged.min, merged.max) == (whole.min, whole.max)
    assert merged.total == a.size + b.size
    # merging is order-free, as HINCRBY from several instances needs
    other = ScoreHistogram.from_scores(b).merge(ScoreHistogram.from_scores(a))
    np.testing.assert_array_equal(other.counts, merged.counts)


@PROPS
@given(st.lists(finite, min_size=1, max_size=80))
def test_sparse_round_trip(xs):
    h = ScoreHistogram.from_scores(np.array(xs))
    sparse = h.sparse()
    assert all(isinstance(k, int) and isinstance(v, int) and v > 0 for k, v in sparse.items())
    back = ScoreHistogram.from_sparse(sparse, h.min, h.max)
    np.testing.assert_array_equal(back.counts, h.counts)
    assert (back.min, back.max) == (h.min, h.max)


def test_from_sparse_accepts_string_keys_and_rejects_out_of_range_buckets():
    h = ScoreHistogram.from_sparse({"2048": "3", 2049: 1}, 0.0, 0.0005)  # as read back from Redis
    assert h.total == 4 and h.counts[2048] == 3
    with pytest.raises(ValueError, match="bucket 4096 outside 0..4095"):
        ScoreHistogram.from_sparse({BINS: 1}, 0.0, 1.0)
    with pytest.raises(ValueError, match="bucket -1"):
        ScoreHistogram.from_sparse({-1: 1}, 0.0, 1.0)


@pytest.mark.parametrize("name, sample", [
    ("normal", lambda rng: rng.standard_normal(200_000)),
    ("probabilities", lambda rng: rng.beta(5.0, 2.0, 200_000)),
    ("margins", lambda rng: rng.gamma(2.0, 0.8, 200_000)),
])
def test_quantiles_close_to_numpy_for_a_large_sample(name, sample):
    x = sample(np.random.default_rng(7))
    probs = np.linspace(0.01, 0.99, 99)
    got = ScoreHistogram.from_scores(x).quantiles(probs)
    want = np.quantile(x, probs)
    spread = want[-1] - want[0]
    assert np.max(np.abs(got - want)) < 0.002 * spread, name
    assert np.all(np.diff(got) >= 0)


def test_quantiles_extremes_are_exact_min_and_max():
    x = np.array([-2.5, 0.3, 0.31, 4.0])
    q = ScoreHistogram.from_scores(x).quantiles(np.array([0.0, 1.0]))
    assert q.tolist() == [-2.5, 4.0]


def test_quantiles_do_not_fall_into_gaps_between_clusters():
    # Regression: interpolating between bucket *upper* edges spread the 0.9
    # bucket's mass over the empty gap (0.1, 0.9) and returned 0.5 here.
    x = np.array([0.1] * 50 + [0.9] * 50)
    q = ScoreHistogram.from_scores(x).quantiles(np.array([0.25, 0.75]))
    lower_09 = bin_edges_score()[bin_index(np.array([0.9]))[0]]
    assert 0.1 <= q[0] < 0.101
    assert lower_09 <= q[1] <= 0.9


def test_empty_histogram_raises_clearly():
    h = ScoreHistogram()
    with pytest.raises(ValueError, match="empty"):
        h.quantiles(np.array([0.5]))
    with pytest.raises(ValueError, match="empty"):
        h.occupied_edges()
    with pytest.raises(ValueError, match="empty"):
        boundaries(h, 4, "perc")


@pytest.mark.parametrize("bad, pos", [(float("nan"), 1), (float("inf"), 1), (float("-inf"), 1)])
def test_non_finite_scores_raise_naming_the_position(bad, pos):
    scores = np.array([0.4, bad, 0.7])
    with pytest.raises(ValueError, match=rf"scores\[{pos}\] = {bad!r}"):
        ScoreHistogram.from_scores(scores)
    with pytest.raises(ValueError, match=rf"scores\[{pos}\]"):
        stratify(scores, 4)
    with pytest.raises(ValueError, match=rf"scores\[{pos}\]"):
        assign(scores, np.array([0.5]))
    h = ScoreHistogram.from_scores(np.array([0.1]))
    with pytest.raises(ValueError, match=rf"scores\[{pos}\]"):
        h.add(scores)
    assert h.total == 1  # nothing half-added


def test_require_finite_names_the_field_and_flattens():
    assert require_finite([[1, 2], [3, 4]]).tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match=r"score\[3\] = nan"):
        require_finite([[1, 2], [3, float("nan")]], "score")


# ---------------------------------------------------------------- boundaries: hand cases


def test_equal_width_on_unit_interval_hand_case():
    sparse = np.array([0.0, 0.1, 0.3, 0.6, 0.8, 1.0])
    cuts, stratum = stratify(sparse, 4, "equal")
    np.testing.assert_allclose(cuts, [0.25, 0.5, 0.75], rtol=0, atol=1e-15)
    assert stratum.tolist() == [0, 0, 1, 2, 3, 3]
    dense = np.concatenate([[0.0, 1.0], np.random.default_rng(0).uniform(0, 1, 10_000)])
    np.testing.assert_allclose(stratify(dense, 4, "equal")[0], [0.25, 0.5, 0.75], rtol=0, atol=1e-15)


def test_perc_on_1_to_1000_is_near_quartiles():
    s = np.arange(1.0, 1001.0)
    cuts, stratum = stratify(s, 4, "perc")
    # The grid is coarse at |s| ~ 500 (a bucket is (1+s)^2 * 2/4096 ~ 120 wide):
    # interpolation inside buckets still lands within a few units here.
    np.testing.assert_allclose(cuts, np.quantile(s, [0.25, 0.5, 0.75]), atol=5.0)
    counts = np.bincount(stratum)
    assert counts.size == 4 and np.all(np.abs(counts - 250) <= 5)


# A hand-made histogram: buckets 2048..2051 (scores in [0, 4/2044)) with counts
# 1, 4, 9, 16; min = 0, max in the middle of the top bucket.
HAND_MAX = (edge(3) + edge(4)) / 2


def hand_histogram() -> ScoreHistogram:
    return ScoreHistogram.from_sparse({2048: 1, 2049: 4, 2050: 9, 2051: 16}, 0.0, HAND_MAX)


def test_cum_sqrt_f_hand_case():
    h = hand_histogram()
    # sqrt(f) = 1, 2, 3, 4 (total 10), cumulative 1, 3, 6, 10 at the bucket tops.
    # K=2: 5 is crossed inside bucket 2050 at (5 - 3) / 3 = 2/3 of its width.
    want = edge(2) + (2 / 3) * (edge(3) - edge(2))
    np.testing.assert_allclose(boundaries(h, 2, "cum_sqrt_f"), [want], rtol=1e-12)
    # K=3: 10/3 is crossed 1/9 into bucket 2050 and 20/3 1/6 into the top bucket,
    # so the middle stratum would hold no whole bucket: both cuts snap to the
    # nearer bucket edge, leaving exactly bucket 2050 in the middle stratum.
    np.testing.assert_allclose(boundaries(h, 3, "cum_sqrt_f"), [edge(2), edge(3)], rtol=1e-12)


def test_perc_and_equal_hand_cases_on_the_hand_histogram():
    h = hand_histogram()
    # counts cumulate 1, 5, 14, 30; 15 is crossed 1/16 into the top bucket,
    # whose upper edge is clipped to the exact maximum.
    want = edge(3) + (HAND_MAX - edge(3)) / 16
    np.testing.assert_allclose(boundaries(h, 2, "perc"), [want], rtol=1e-12)
    np.testing.assert_allclose(boundaries(h, 2, "equal"), [HAND_MAX / 2], rtol=1e-12)
    # K=3: 10 is 5/9 into bucket 2050, 20 is 6/16 into the top one: both snap to
    # edge(3), the duplicate merges, and two strata remain (documented).
    np.testing.assert_allclose(boundaries(h, 3, "perc"), [edge(3)], rtol=1e-12)


def test_k_equal_one_or_a_single_value_gives_one_stratum():
    x = np.array([0.3, 0.7, 0.9])
    for m in STRATIFICATIONS:
        assert boundaries(ScoreHistogram.from_scores(x), 1, m).size == 0
        assert boundaries(ScoreHistogram.from_scores(np.full(50, 0.42)), 8, m).size == 0


@pytest.mark.parametrize("method", STRATIFICATIONS)
def test_fewer_distinct_values_than_k_gives_fewer_strata(method):
    x = np.array([0.2] * 30 + [0.7] * 10 + [0.71] * 5)
    cuts, stratum = stratify(x, 6, method)
    assert 1 <= cuts.size <= 2  # at most 3 strata for 3 distinct values
    counts = np.bincount(stratum, minlength=cuts.size + 1)
    assert np.all(counts > 0)
    # tied scores are never split between strata
    for v in (0.2, 0.7, 0.71):
        assert np.unique(stratum[x == v]).size == 1


@pytest.mark.parametrize("method", STRATIFICATIONS)
@pytest.mark.parametrize("k", [2, 4, 10])
def test_dense_sample_gets_exactly_k_strata(method, k):
    x = np.random.default_rng(3).uniform(0.5, 1.0, 50_000)
    cuts, stratum = stratify(x, k, method)
    assert cuts.size == k - 1
    counts = np.bincount(stratum, minlength=k)
    if method == "perc":
        assert np.all(np.abs(counts / x.size - 1 / k) < 0.01)
    assert np.all(counts > 0)


def test_equal_width_cuts_on_skewed_scores_can_merge_but_never_leave_empty_strata():
    # one outlier far above the rest: equal width would leave the middle strata empty
    x = np.concatenate([np.random.default_rng(1).uniform(0, 1, 500), [100.0]])
    cuts, stratum = stratify(x, 5, "equal")
    assert cuts.size < 4
    assert np.all(np.bincount(stratum, minlength=cuts.size + 1) > 0)


@pytest.mark.parametrize("k", [0, -1, 2.5, "4", None])
def test_bad_k_raises(k):
    h = ScoreHistogram.from_scores(np.array([0.1, 0.9]))
    with pytest.raises(ValueError, match="strata must be a positive integer"):
        boundaries(h, k, "perc")


def test_numpy_integer_k_is_accepted():
    h = ScoreHistogram.from_scores(np.linspace(0, 1, 101))
    assert boundaries(h, np.int64(4), "perc").size == 3


def test_unknown_method_raises():
    h = ScoreHistogram.from_scores(np.array([0.1, 0.9]))
    with pytest.raises(ValueError, match="stratification must be one of"):
        boundaries(h, 4, "quantile")


# ---------------------------------------------------------------- boundaries: properties


@pytest.mark.slow
@PROPS
@given(score_samples(), st.integers(1, 30), st.sampled_from(STRATIFICATIONS))
def test_boundaries_monotone_inside_range_cover_all_scores_no_empty_stratum(scores, k, method):
    hist = ScoreHistogram.from_scores(scores)
    cuts = boundaries(hist, k, method)
    distinct = np.unique(scores).size
    assert cuts.ndim == 1
    assert cuts.size <= min(k, distinct) - 1
    assert np.all(np.diff(cuts) > 0)  # strictly increasing
    if cuts.size:
        assert cuts[0] > scores.min() and cuts[-1] <= scores.max()
    stratum = assign(scores, cuts)
    assert stratum.min() >= 0 and stratum.max() <= cuts.size  # every score has a stratum
    counts = np.bincount(stratum, minlength=cuts.size + 1)
    assert counts.size == cuts.size + 1
    assert np.all(counts > 0), f"empty stratum: cuts={cuts}, counts={counts}"


@pytest.mark.slow
@PROPS
@given(score_samples(), st.integers(2, 12), st.sampled_from(STRATIFICATIONS))
def test_boundaries_depend_only_on_the_histogram(scores, k, method):
    # The service rebuilds strata from the (Redis) sparse form; same answer.
    hist = ScoreHistogram.from_scores(scores)
    again = ScoreHistogram.from_sparse(hist.sparse(), hist.min, hist.max)
    np.testing.assert_array_equal(boundaries(hist, k, method), boundaries(again, k, method))


@pytest.mark.slow
@PROPS
@given(score_samples(), st.sampled_from(STRATIFICATIONS))
def test_two_strata_whenever_the_histogram_can_separate_scores(scores, method):
    hist = ScoreHistogram.from_scores(scores)
    assume(len(hist.sparse()) >= 2)  # scores in one bucket are indistinguishable
    cuts = boundaries(hist, 2, method)
    assert cuts.size == 1
    assert np.all(np.bincount(assign(scores, cuts), minlength=2) > 0)


def test_assign_is_left_closed():
    cuts = np.array([0.25, 0.5])
    assert assign(np.array([0.0, 0.25, 0.4999, 0.5, 9.0]), cuts).tolist() == [0, 1, 1, 2, 2]


def test_histogram_counts_reads_the_bins_string_and_adds_the_legacy_hash():
    from stratameter.state.records import histogram_counts

    # BITFIELD u32 counters, big-endian, as long as the highest written, the grid rotated by half:
    # the first counter is bucket 2048 (score 0), the third bucket 2050
    packed = (3).to_bytes(4, "big") + bytes(4) + (70000).to_bytes(4, "big")
    counts = histogram_counts(packed, {b"2050": b"5", b"4095": b"1"})
    assert counts.shape == (BINS,) and counts.dtype == np.int64
    assert (counts[2048], counts[2049], counts[2050], counts[4095]) == (3, 0, 70005, 1) and counts.sum() == 70009
    # bucket 0 (the most negative scores) is the 2048th counter
    assert histogram_counts(bytes(4 * 2048) + (7).to_bytes(4, "big"), {})[0] == 7
    assert not histogram_counts(None, {}).any()
