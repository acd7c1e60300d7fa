"""Kumar & Raj's stratification methods beyond today's three (`stats.strata`, `stats.clustering`):
CBRT, WTMN, k-means and a Gaussian mixture, all from the mergeable score histogram; and the
prior-weighted Dalenius-Hodges rule the predicted negatives take by default (``cum_sqrt_prior``)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from stratameter.stats import clustering
from stratameter.stats.sketch import ScoreHistogram, bin_edges_score, bin_index
from stratameter.stats.strata import STRATIFICATIONS, assign, boundaries, stratify

NEW = ("cum_cbrt_f", "wtmn", "kmeans", "gmm")
UNIFORM = np.linspace(0.0, 1.0, 10_001)


def test_the_papers_seven_methods_are_offered():
    assert STRATIFICATIONS[:3] == ("perc", "equal", "cum_sqrt_f") and set(NEW) <= set(STRATIFICATIONS)


def test_wtmn_gives_equal_totals_of_the_score():
    """On [0, 1] uniform the total of z below c is c^2 / 2: equal quarters at sqrt(j / 4)."""
    cuts, _ = stratify(UNIFORM, 4, "wtmn")
    assert cuts == pytest.approx(np.sqrt([0.25, 0.5, 0.75]), abs=2e-3)


def test_cbrt_lies_between_the_equal_count_and_the_sqrt_cuts():
    """The grid's classes are equal in squashed units, so on uniform scores the counts per class
    vary; a smaller root flattens them further toward equal width: perc, sqrt, cbrt in order."""
    perc, sqrt, cbrt = (stratify(UNIFORM, 4, m)[0] for m in ("perc", "cum_sqrt_f", "cum_cbrt_f"))
    equal = stratify(UNIFORM, 4, "equal")[0]
    assert perc == pytest.approx(equal, abs=2e-3)  # uniform: equal count is equal width
    counts = ScoreHistogram.from_scores(UNIFORM).occupied_edges()[2]
    x, f = ScoreHistogram.from_scores(UNIFORM).cdf_knots(np.cbrt(counts))
    assert cbrt == pytest.approx(np.interp([0.25, 0.5, 0.75], f, x))  # the rule itself
    assert np.all(np.abs(cbrt - perc) >= np.abs(sqrt - perc) - 1e-9)


def test_kmeans_hand_case():
    """Lloyd on four weighted points: clusters {0, 1} and {9, 10} have means 0.5 and 9.5."""
    means = clustering.kmeans_1d(np.array([0.0, 1.0, 9.0, 10.0]), np.ones(4), np.array([0.8]))
    assert means == pytest.approx([0.5, 9.5])
    # weights pull the mean: 3 x 0 and 1 x 1 -> 0.25
    assert clustering.kmeans_1d(np.array([0.0, 1.0, 9.0]), np.array([3.0, 1.0, 1.0]), np.array([5.0])) \
        == pytest.approx([0.25, 9.0])


@pytest.mark.parametrize("method", ["kmeans", "gmm"])
def test_clusters_become_strata(method):
    rng = np.random.default_rng(0)
    two = np.concatenate([rng.normal(0.1, 0.02, 5000), rng.normal(0.9, 0.02, 5000)])
    cuts, stratum = stratify(two, 2, method)
    assert cuts.size == 1 and 0.2 < cuts[0] <= 0.85
    assert np.bincount(stratum).tolist() == [5000, 5000]
    three = np.concatenate([rng.normal(m, 0.03, 3000) for m in (0.2, 0.5, 0.8)])
    cuts, stratum = stratify(three, 3, method)
    assert cuts.size == 2 and 0.25 < cuts[0] < 0.45 < 0.55 < cuts[1] < 0.75  # in the gaps
    assert np.all(np.abs(np.bincount(stratum) - 3000) < 30)


def test_gmm_hand_case_two_components():
    """Two equal, equally spread components at 0 and 1: the posterior crosses 1/2 at 0.5, so the
    cut is the lower edge of the first point past it."""
    x = np.array([-0.1, 0.0, 0.1, 0.9, 1.0, 1.1])
    cuts = clustering.gmm_1d_cuts(x, np.ones(6), np.array([0.0, 1.0]), lower=x - 0.05, fallback=np.array([0.5]))
    assert cuts == pytest.approx([0.85])


def test_gmm_falls_back_on_the_kmeans_cut_when_a_component_is_swallowed():
    """Scores in [0, 1] and one outlier at 18 (found by the property test in
    tests/unit/test_sketch_strata.py): the mixture's wide component takes the outlier too, so no
    point is more likely above the first component; the k-means cut keeps two strata."""
    scores = np.concatenate([[18.0], np.random.default_rng(14).random(1000)])
    hist = ScoreHistogram.from_scores(scores)
    lower, upper, counts = hist.occupied_edges()
    mid = (lower + upper) / 2.0
    means = clustering.kmeans_1d(mid, counts, np.array([1.0]))
    no_fallback = clustering.gmm_1d_cuts(mid, counts, means, lower, np.array([np.nan]))
    assert np.isnan(no_fallback).all()  # this population does swallow the outlier's component
    for method in ("kmeans", "gmm"):
        cuts, stratum = stratify(scores, 2, method)
        assert cuts.size == 1 and np.all(np.bincount(stratum) > 0), method


@pytest.mark.slow
@pytest.mark.parametrize("method", STRATIFICATIONS)
@pytest.mark.parametrize("k", [1, 2, 4, 20])
@pytest.mark.parametrize("population", ["uniform", "logits", "beta"])
def test_every_method_gives_nonempty_increasing_strata(method, k, population):
    rng = np.random.default_rng(7)
    scores = {"uniform": UNIFORM, "logits": rng.normal(0.0, 3.0, 20_000),
              "beta": rng.beta(0.5, 3.0, 50_000)}[population]
    hist = ScoreHistogram.from_scores(scores)
    cuts = boundaries(hist, k, method)
    assert cuts.size <= k - 1 and np.all(np.diff(cuts) > 0)
    assert np.all((cuts > hist.min) & (cuts <= hist.max))
    assert np.all(np.bincount(assign(scores, cuts), minlength=cuts.size + 1) > 0)
    assert np.array_equal(cuts, boundaries(ScoreHistogram.from_sparse(hist.sparse(), hist.min, hist.max), k, method))
    if k == 4:
        assert cuts.size == 3


@pytest.mark.parametrize("method", NEW)
def test_fewer_distinct_scores_than_strata(method):
    assert stratify(np.full(100, 0.3), 4, method)[0].size == 0
    cuts, stratum = stratify(np.array([0.1] * 50 + [0.9] * 50), 5, method)
    assert cuts.size == 1 and np.bincount(stratum).tolist() == [50, 50]
    assert stratify(np.array([-1e300, 1e300, 0.0, 5.0]), 3, method)[0].size >= 1  # no overflow


def test_gmm_stays_fast_enough_for_a_chunk_opening():
    """The service computes a chunk's strata when it opens: the mixture is fitted on at most
    `clustering.EM_POINTS` merged buckets, so even K = 20 on a wide histogram takes well under a
    second (a bound on the work, checked loosely; the timing itself is not the test's point)."""
    hist = ScoreHistogram.from_scores(np.random.default_rng(1).normal(0.0, 3.0, 20_000))
    assert hist.occupied_edges()[0].size > clustering.EM_POINTS
    started = time.process_time()
    boundaries(hist, 20, "gmm")
    assert time.process_time() - started < 5.0


def _two_buckets(low: float, high: float, count: int = 100) -> ScoreHistogram:
    """`count` scores in the bucket of `low` and as many in the bucket of `high`, the histogram's
    range their two buckets' outer edges (so no edge is clipped)."""
    edges = bin_edges_score()
    b1, b2 = (int(b) for b in bin_index(np.array([low, high])))
    return ScoreHistogram.from_sparse({b1: count, b2: count}, float(edges[b1]), float(edges[b2 + 1]))


def test_cum_sqrt_prior_hand_case():
    """Two buckets of equal counts f whose midpoints m1 < m2 <= 1/2 read as probabilities: their
    weights are sqrt(f m1 (1 - m1)) = w and r w with r = sqrt(m2 (1 - m2) / (m1 (1 - m1))) > 1, so the
    cumulative weight is w at the top of the first and (1 + r) w in all; for K = 2 its half is crossed
    inside the second bucket, ((1 + r)/2 - 1) / r = (r - 1) / (2 r) of the way across."""
    h = _two_buckets(0.05, 0.4)
    lower, upper, _ = h.occupied_edges()
    m1, m2 = (lower + upper) / 2.0
    r = math.sqrt(m2 * (1.0 - m2) / (m1 * (1.0 - m1)))
    want = lower[1] + (r - 1.0) / (2.0 * r) * (upper[1] - lower[1])
    assert boundaries(h, 2, "cum_sqrt_prior") == pytest.approx([want], rel=1e-12)
    assert upper[0] <= boundaries(h, 2, "cum_sqrt_f")[0] <= lower[1]  # equal weights: in the gap between them


def test_cum_sqrt_prior_reads_the_scores_as_the_classifier_says():
    """On scores in [0, 1], ``auto`` reads them as probabilities; ``logit`` as margins (expit), which
    weighs the two buckets nearly alike here, so the cut moves back toward the first bucket's top."""
    h = _two_buckets(0.05, 0.4)
    auto, probability, logit = (boundaries(h, 2, "cum_sqrt_prior", kind) for kind in ("auto", "probability", "logit"))
    assert auto == pytest.approx(probability)
    assert logit[0] < probability[0]


def test_cum_sqrt_prior_narrows_the_negatives_next_to_the_threshold():
    """Predicted negatives of a fraud-like model (scores expit(z), z ~ N(-4, 1.3), below 1/2): the
    stratum next to the threshold holds fewer of them than with `cum_sqrt_f`, the farthest more."""
    rng = np.random.default_rng(0)
    s = 1.0 / (1.0 + np.exp(-rng.normal(-4.0, 1.3, 200_000)))
    s = s[s < 0.5]
    sizes = {m: np.bincount(stratify(s, 4, m)[1], minlength=4) for m in ("cum_sqrt_f", "cum_sqrt_prior")}
    assert sizes["cum_sqrt_prior"][-1] < sizes["cum_sqrt_f"][-1] / 2
    assert sizes["cum_sqrt_prior"][0] > sizes["cum_sqrt_f"][0]
