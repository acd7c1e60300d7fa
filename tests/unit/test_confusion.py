"""Recall, F1 and accuracy from one stratified sample of the whole stream (stats.confusion)."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.stats import allocation, confusion, estimator
from stratameter.stats.target import Target

# Two strata: 10 predicted positives (8 truly positive), 90 predicted negatives (9 truly positive).
N = np.array([10.0, 90.0])
P = np.array([0.8, 0.1])
SIDE = np.array([True, False])


def test_metric_values_hand_computed():
    # TP 8, FP 2, FN 9, TN 81
    assert confusion.value("precision", N, P, SIDE) == pytest.approx(8 / 10)
    assert confusion.value("recall", N, P, SIDE) == pytest.approx(8 / 17)
    assert confusion.value("f1", N, P, SIDE) == pytest.approx(16 / 27)
    assert confusion.value("accuracy", N, P, SIDE) == pytest.approx(89 / 100)


def test_undefined_metrics_are_nan():
    nothing_positive = np.array([0.0, 0.0])
    assert np.isnan(confusion.value("recall", N, nothing_positive, SIDE))
    assert np.isnan(confusion.value("precision", np.array([0.0, 90.0]), P, SIDE))


@pytest.mark.parametrize("metric", confusion.METRICS)
def test_gradient_matches_finite_differences(metric):
    N3 = np.array([40.0, 60.0, 900.0])
    p = np.array([0.6, 0.9, 0.02])
    side = np.array([True, True, False])
    g = confusion.gradient(metric, N3, p, side)
    eps = 1e-6
    for k in range(3):
        up, down = p.copy(), p.copy()
        up[k] += eps
        down[k] -= eps
        numeric = (confusion.value(metric, N3, up, side) - confusion.value(metric, N3, down, side)) / (2 * eps)
        assert g[k] == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_recall_gradient_hand_computed():
    # TP 8, FN 9: dR/dp_pos = N_pos FN / 17^2, dR/dp_neg = -N_neg TP / 17^2
    g = confusion.gradient("recall", N, P, SIDE)
    assert g == pytest.approx([10 * 9 / 289, -90 * 8 / 289])


def test_linearised_variance_hand_computed():
    n, h = np.array([4, 10]), np.array([3, 1])
    p = np.array([3.5 / 5, 1.5 / 11])  # half-label smoothed
    var_p = p * (1 - p) / (n - 1)  # s^2 / n with s^2 = n/(n-1) p (1-p), no fpc
    tp, fn = 10 * p[0], 90 * p[1]
    g = np.array([10 * fn, -90 * tp]) / (tp + fn) ** 2
    expected = float(np.sum(g * g * var_p))
    assert confusion.linearised_variance("recall", N, n, h, SIDE, fpc=False) == pytest.approx(expected)
    assert expected == pytest.approx(0.045286, rel=1e-4)


def test_linear_metrics_use_the_precision_interval():
    n, h = np.array([6, 12]), np.array([5, 2])
    prec = confusion.metric_interval("precision", N, n, h, SIDE)
    ref = estimator.wilson_interval(N[:1], n[:1], h[:1])
    assert (prec.lower, prec.upper) == (ref.lower, ref.upper)
    acc = confusion.metric_interval("accuracy", N, n, h, SIDE)
    ref = estimator.wilson_interval(N, n, np.array([5, 10]))  # right: 5 TP, 10 TN
    assert (acc.lower, acc.upper) == (ref.lower, ref.upper)


@pytest.mark.parametrize("metric", ["recall", "f1"])
def test_ratio_interval_never_collapses(metric):
    # every positive-side label right, no false negative seen yet: the plug-in is 1
    N3 = np.array([500.0, 500.0, 99_000.0])
    side = np.array([True, True, False])
    n, h = np.array([30, 30, 40]), np.array([30, 30, 0])
    iv = confusion.metric_interval(metric, N3, n, h, side)
    assert 0.0 < iv.lower < iv.upper <= 1.0
    assert iv.upper - iv.lower > 0.01
    assert np.isfinite(iv.stderr) and iv.stderr > 0


def test_ratio_interval_needs_two_labels_per_stratum():
    iv = confusion.metric_interval("recall", N, np.array([5, 1]), np.array([4, 0]), SIDE)
    assert np.isnan(iv.lower) and np.isnan(iv.upper)


def test_parse_metrics():
    assert confusion.parse_metrics("recall, precision") == ("precision", "recall")
    assert confusion.parse_metrics(["F1"]) == ("f1",)
    with pytest.raises(ValueError, match="unknown metric 'recal'"):
        confusion.parse_metrics("precision,recal")
    with pytest.raises(ValueError, match="at least one metric"):
        confusion.parse_metrics(" , ")
    assert confusion.needs_negatives(("precision",)) is False
    assert confusion.needs_negatives(("precision", "accuracy")) is True


def test_allocation_scale_for_precision_alone_is_todays_allocation():
    N4 = np.array([100.0, 300.0, 5000.0, 800.0])
    side = np.array([True, True, False, False])
    n, h = np.array([5, 9, 4, 6]), np.array([4, 8, 0, 1])
    scale = confusion.allocation_scale(("precision",), N4, n, h, side)
    assert scale[0] == pytest.approx(scale[1]) and scale[0] > 0
    assert np.all(scale[2:] == 0)
    # precision alone has no negative strata: the scale is a constant, today's allocation
    q = np.array([0.7, 0.9])
    today = allocation.allocate_opt_track(N4[:2], n[:2], h[:2], q, 8)
    scaled = allocation.allocate_opt_track(N4[:2], n[:2], h[:2], q, 8, scale=scale[:2])
    assert scaled.tolist() == today.tolist()


def test_allocation_scale_weighs_the_widest_metric():
    N4 = np.array([100.0, 300.0, 5000.0, 800.0])
    side = np.array([True, True, False, False])
    n, h = np.array([5, 9, 4, 6]), np.array([4, 8, 0, 1])
    both = ("precision", "recall")
    recall_only = confusion.allocation_scale(("recall",), N4, n, h, side)
    mostly_recall = confusion.allocation_scale(both, N4, n, h, side, [np.array(1e-9), np.array(1.0)])
    assert mostly_recall / mostly_recall[2] == pytest.approx(recall_only / recall_only[2], rel=1e-3)


def _fixed_sample(metric, runs, seed):
    """Coverage and centre of the interval at a fixed allocation (no stopping rule)."""
    rng = np.random.default_rng(seed)
    N4 = np.array([2_000.0, 2_000.0, 150_000.0, 46_000.0])
    P4 = np.array([0.75, 0.97, 0.002, 0.03])  # false negatives rare far from the threshold
    side = np.array([True, True, False, False])
    n = np.array([100, 60, 600, 400])
    h = rng.binomial(n, P4, size=(runs, 4))
    truth = confusion.value(metric, N4, P4, side)
    iv = confusion.metric_interval(metric, N4, n, h, side, fpc=False)
    return iv, truth


@pytest.mark.parametrize("metric", ["recall", "f1"])
def test_ratio_interval_coverage_at_a_fixed_sample_with_rare_false_negatives(metric):
    # 4000 runs: s.e. of a 0.95 coverage is 0.0034
    iv, truth = _fixed_sample(metric, 4000, 11)
    cover = np.mean((iv.lower <= truth) & (truth <= iv.upper))
    assert 0.938 <= cover <= 0.99, (metric, cover, truth)
    # the reported estimate carries the adaptive allocation's bias term, which a fixed sample like
    # this one does not need: it moves the estimate by far less than the half-width (the bias
    # bar is on the default design's own samples: tests/unit/test_whole_budget.py)
    assert abs(np.mean(iv.estimate) - truth) < 0.25 * np.mean(iv.halfwidth)
    assert np.all(iv.upper - iv.lower > 0)


@pytest.mark.slow
@pytest.mark.parametrize("metric,population", [("recall", "moderation"), ("f1", "svm-two-sided"),
                                               ("accuracy", "balanced"), ("recall", "abuse-rare-weak")])
def test_default_design_coverage_at_stop(metric, population):
    """The whole-stream online loop (stratification, allocation, stopping) on a
    built-in population: 2000 runs at delta 0.05, coverage s.e. 0.005."""
    from stratameter.simulate.engine import Protocol
    from stratameter.simulate.whole import WholeDesign, max_labels, prepare_whole, run_whole_until_stop
    from stratameter.simulate.whole_populations import whole_builtin

    pop = whole_builtin(population)
    design, protocol = WholeDesign(), Protocol(delta=0.05)
    st = prepare_whole(pop, design, [metric])
    r = run_whole_until_stop(st, design, [metric], protocol, 2000, 5, max_labels(pop, protocol))
    truth = pop.truth(metric)
    cover = np.mean((r.lower[metric] <= truth) & (truth <= r.upper[metric]))
    assert r.stopped.all()
    assert cover >= 0.935, cover
    assert abs(np.mean(r.estimate[metric]) - truth) < 0.01


# ------------------------------------------------------------------ the stream design with a Target

def test_precision_target_is_todays_stream_design():
    from stratameter.stats import streams

    rng = np.random.default_rng(4)
    N = rng.integers(50, 5000, size=(30, 4)).astype(float)
    n = rng.integers(2, 40, size=(30, 4))
    h = rng.binomial(n, 0.7)
    q = rng.random((30, 4))
    t = Target.precision(4)
    assert np.array_equal(streams.target_labels(N, n, h, q, 0.02, 0.95, True),
                          streams.target_labels(N, n, h, q, 0.02, 0.95, True, target=t))
    a = streams.chunk_interval(N, n, h, 0.95, True)
    b = streams.chunk_interval(N, n, h, 0.95, True, target=t)
    assert np.array_equal(a.lower, b.lower) and np.array_equal(a.upper, b.upper)
    tau, final = np.zeros((30, 4)), N * 1.5
    args = (N, n, h, q, tau, final, False, True, False, 0.02, 0.95, 8)
    for x, y in zip(streams.plan_requests(*args, closed=True), streams.plan_requests(*args, closed=True, target=t)):
        assert np.array_equal(x, y)


def test_target_labels_reach_delta_on_the_linearised_variance():
    """With the proportions known, n*_k = n* |g_k| S_k / sum |g| S makes
    ``z^2 margin sum_k g_k^2 S_k^2 / n*_k = delta^2`` (Kumar & Raj Eq. 9-10 on the linearised variable)."""
    from stratameter.stats import streams
    from stratameter.stats.estimator import STOPPING_VARIANCE_MARGIN, z_value

    N4 = np.array([3_000.0, 2_000.0, 60_000.0, 15_000.0])
    side = np.array([True, True, False, False])
    p = np.array([0.7, 0.95, 0.004, 0.05])
    n = np.full(4, 10**9)  # pseudo-observations negligible: the spread is the labels'
    h = np.round(n * p)
    need = streams.target_labels(N4, n * 0, h * 0, p, 0.02, 0.95, target=Target(("recall",), side))
    g = confusion.gradient("recall", N4, p, side)
    # pseudo_smoothed with no labels is the prior q = p
    v = np.sum(g * g * p * (1 - p) / need)
    assert z_value(0.95) ** 2 * STOPPING_VARIANCE_MARGIN * v == pytest.approx(0.02**2, rel=1e-9)
    assert need[2] > need[3] > 0  # the big near-zero stratum still needs labels


def test_plan_requests_sends_labels_to_negative_strata_for_recall():
    from stratameter.stats import streams

    N4 = np.array([300.0, 200.0, 6000.0, 1500.0])
    side = np.array([True, True, False, False])
    n, h = np.array([10, 10, 10, 10]), np.array([7, 9, 0, 1])
    q = np.array([0.7, 0.95, 0.01, 0.06])
    args = (N4, n, h, q, np.full(4, 0.01), N4, False, True, False, 0.05, 0.95, 8)
    _, want_p = streams.plan_requests(*args)
    _, want_r = streams.plan_requests(*args, target=Target(("recall",), side))
    assert want_r[2:].sum() > 0 and want_r.sum() >= 8
    assert want_p.sum() >= 8
    with pytest.raises(ValueError, match="need a metric"):
        Target(("precision",), side)


def test_plan_requests_allocates_a_metric_on_the_residual_spread_where_given():
    """The difference estimator's spread ratios (`difference.Calibrated.allocation_scale`) multiply
    the metric's allocation scale: the same round, with one stratum's residual spread a tenth of
    its labels', gives that stratum its allocation times a tenth (before rounding); ones: unchanged."""
    from stratameter.stats import allocation, streams

    N4 = np.array([300.0, 200.0, 6000.0, 1500.0])
    side = np.array([True, True, False, False])
    n, h = np.array([10, 10, 10, 10]), np.array([7, 9, 0, 1])
    q = np.array([0.7, 0.95, 0.01, 0.06])
    target = Target(("recall",), side)
    args = (N4, n, h, q, np.full(4, 0.01), N4, False, True, False, 0.05, 0.95, 40)
    _, plain = streams.plan_requests(*args, target=target)
    _, ones = streams.plan_requests(*args, target=target, spread_scale=np.ones(4))
    _, cut = streams.plan_requests(*args, target=target, spread_scale=np.array([1.0, 1.0, 0.1, 1.0]))
    assert ones.tolist() == plain.tolist()
    scale = confusion.allocation_scale(("recall",), N4, n, h, side)
    expected = allocation.allocate_opt_track(N4, n, h, q, 40, with_replacement=False,
                                             scale=scale * np.array([1.0, 1.0, 0.1, 1.0]))
    assert cut.tolist() == np.maximum(expected, streams.catch_up(N4, n, h, q, 0.05, 0.95, target)).tolist()
    assert cut[2] < plain[2]


def test_widest_interval_is_the_widest_metric():
    N4 = np.array([300.0, 200.0, 6000.0, 1500.0])
    side = np.array([True, True, False, False])
    n, h = np.array([10, 10, 10, 10]), np.array([7, 9, 0, 1])
    t = Target(("precision", "recall", "accuracy"), side)
    ivs = t.intervals(N4, n, h, 0.95, False)
    widest = t.widest(N4, n, h, 0.95, False)
    assert widest.halfwidth == pytest.approx(max(iv.halfwidth for iv in ivs.values()))
    assert np.isnan(t.widest(N4, np.array([10, 1, 10, 10]), h.clip(0, 1), 0.95, False).halfwidth)


@pytest.mark.slow
def test_all_four_metrics_at_once_cover_and_cost_little_more_than_the_hardest():
    """One sample for precision, recall, F1 and accuracy (moderation, delta 0.05, 2000 runs):
    every metric's interval covers at the nominal rate, and the labels are within 25 % of
    what the hardest metric (recall) needs alone."""
    from stratameter.simulate.engine import Protocol
    from stratameter.simulate.whole import WholeDesign, max_labels, prepare_whole, run_whole_until_stop
    from stratameter.simulate.whole_populations import whole_builtin

    pop, design, protocol = whole_builtin("moderation"), WholeDesign(), Protocol(delta=0.05)
    every = confusion.METRICS
    r = run_whole_until_stop(prepare_whole(pop, design, every), design, every, protocol, 2000, 7,
                             max_labels(pop, protocol))
    for m in every:
        truth = pop.truth(m)
        cover = np.mean((r.lower[m] <= truth) & (truth <= r.upper[m]))
        assert cover >= 0.935, (m, cover)
        assert np.all(r.upper[m] - r.lower[m] <= 2 * protocol.delta + 1e-12)
    alone = run_whole_until_stop(prepare_whole(pop, design, ["recall"]), design, ["recall"], protocol, 500, 7,
                                 max_labels(pop, protocol))
    assert r.labels.mean() <= 1.25 * alone.labels.mean()


@pytest.mark.slow
def test_precision_of_both_sides_is_the_chunk_interval_of_the_positives():
    """The API reports precision once (`views.chunk_view` takes the top-level interval from the
    metrics): with or without the negatives' strata after the positives', the metric interval
    of precision is the positives' chunk interval, open (no fpc) and closed."""
    from stratameter.stats import streams

    rng = np.random.default_rng(7)
    for i in range(500):
        k_pos, k_neg = 4, int(rng.integers(0, 5))
        N = rng.integers(1, 1000, k_pos + k_neg).astype(float)
        n = np.minimum(N, rng.integers(0, 40, k_pos + k_neg)).astype(float)
        h = np.floor(n * rng.random(k_pos + k_neg))
        positive = np.arange(k_pos + k_neg) < k_pos
        closed = bool(i % 2)
        a = streams.chunk_interval(N[positive], n[positive], h[positive], 0.95, closed)
        b = confusion.metric_interval("precision", N, n, h, positive, 0.95, fpc=closed)
        np.testing.assert_allclose([a.estimate, a.lower, a.upper, a.stderr], [b.estimate, b.lower, b.upper, b.stderr],
                                   rtol=0, atol=1e-12)


def test_a_metric_over_an_empty_population_is_undefined_not_an_error():
    """A chunk of a classifier sampling both sides whose predicted negatives are stratified before
    its first predicted positive (the loop's absent positive side is one empty stratum): precision
    has no population, so its interval is undefined (NaN), as `value` says, and the widest
    interval is that of the metrics that have one; rows of a batch are judged apart.  It raised
    "the population is empty" from the loop's every step of that chunk (seen in the demo's
    fraud-rare classifier)."""
    from stratameter.stats import streams

    N3, side = np.array([0.0, 600.0, 400.0]), np.array([True, False, False])
    n, h = np.array([0, 10, 10]), np.array([0, 1, 0])
    precision = confusion.metric_interval("precision", N3, n, h, side)
    assert all(np.isnan(getattr(precision, f)) for f in ("estimate", "lower", "upper", "stderr"))
    recall = confusion.metric_interval("recall", N3, n, h, side)
    assert np.isfinite(recall.halfwidth)
    t = Target(("precision", "recall"), side)
    widest = t.widest(N3, n, h, 0.95, False)
    assert widest.halfwidth == pytest.approx(float(recall.halfwidth))
    assert float(streams.chunk_interval(N3, n, h, 0.95, True, t).halfwidth) == pytest.approx(
        float(confusion.metric_interval("recall", N3, n, h, side, fpc=True).halfwidth))
    # the API's chunk of predicted negatives only lists no positive stratum at all
    assert np.isnan(confusion.metric_interval("precision", N3[1:], n[1:], h[1:], side[1:]).halfwidth)
    # nothing at all in the chunk: every metric undefined, so is the widest
    assert np.isnan(t.widest(np.zeros(3), n * 0, h * 0, 0.95, False).halfwidth)
    # a batch: the row with positives keeps its precision interval, the other has none
    Nb = np.array([N3, [50.0, 600.0, 400.0]])
    nb, hb = np.array([n, [10, 10, 10]]), np.array([h, [7, 1, 0]])
    both = confusion.metric_interval("precision", Nb, nb, hb, side)
    assert np.isnan(both.halfwidth[0]) and np.isfinite(both.halfwidth[1])
    assert float(both.halfwidth[1]) == pytest.approx(float(confusion.metric_interval(
        "precision", Nb[1], nb[1], hb[1], side).halfwidth))
    with pytest.raises(ValueError, match="metric must be one of"):
        confusion.metric_interval("precisoin", N3, n, h, side)


def test_a_ratio_interval_reaches_the_guarded_metric_when_few_labels_part_them():
    """32 labels of a chunk of 3,600 (26 predicted positives, 2 labels each; 14, 5, 3, 2 of 2,097,
    679, 513 and 285 predicted negatives, no false negative among them): the plug-in reads recall 1,
    the guarded proportions (h + 1/2) / (n + 1) read, by hand,
    TP = 6/6 + (7 + 6 + 7) x 5/6 = 17.667 and FN = 2097/30 + 679/12 + 513/8 + 285/6 = 238.11,
    recall 17.667 / 255.78 = 0.0691.  The interval reaches down to it (it read [0.82, 1] before),
    so no stopping rule takes it for converged; with many labels nothing changes."""
    N = np.array([6.0, 7, 6, 7, 2097, 679, 513, 285])
    n = np.array([2.0, 2, 2, 2, 14, 5, 3, 2])
    h = np.array([0.0, 2, 2, 2, 0, 0, 0, 0])
    side = np.arange(8) < 4
    tp, fn = 1 + 20 * 5 / 6, 2097 / 30 + 679 / 12 + 513 / 8 + 285 / 6
    iv = confusion.ratio_interval("recall", N, n, h, side)
    assert iv.estimate == pytest.approx(1.0) and iv.upper == pytest.approx(1.0)
    assert iv.lower == pytest.approx(tp / (tp + fn), abs=1e-9)
    many = confusion.ratio_interval("recall", N, N * 0.5, h * 0 + N * 0.5 * np.where(side, 0.8, 0.002), side)
    plain = confusion.reaching(many, 0.5 * (many.lower + many.upper))  # a guarded value inside: unchanged
    assert (plain.lower, plain.upper) == (many.lower, many.upper)
    nan = estimator.Interval(np.array(np.nan), np.array(np.nan), np.array(np.nan), np.array(np.nan))
    assert np.isnan(confusion.reaching(nan, 0.3).lower)  # no bounds yet: still none
