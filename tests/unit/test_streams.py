"""The stream design's pure functions (service/stats/streams.py) on hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.chunks import lifecycle
from stratameter.stats import streams
from stratameter.stats.target import Target
from stratameter.stats.estimator import STOPPING_VARIANCE_MARGIN, z_value


def test_closed_once_the_end_is_further_in_the_past_than_the_lateness():
    assert not lifecycle.is_closed(3900 - 1e-6, 3600, 300)
    assert lifecycle.is_closed(3900, 3600, 300)
    assert lifecycle.is_closed([100, 4000], 3600, 300).tolist() == [False, True]


def test_min_silence_is_30_s_or_a_120th_of_the_chunk():
    assert streams.min_silence(3600) == 30.0
    assert streams.min_silence(60) == 0.5


def test_flowing_until_a_silence_of_20_mean_gaps():
    # 100 items over 99 s: mean gap 1 s, silence threshold max(20 s, 30 s) = 30 s
    assert streams.arrivals_flowing(100, 0, 99, 129, 3600, 3600)
    assert not streams.arrivals_flowing(100, 0, 99, 129.5, 3600, 3600)
    # a slower stream: 10 items over 900 s, gap 100 s, threshold 2000 s
    assert streams.arrivals_flowing(10, 0, 900, 2800, 3600, 3600)
    assert not streams.arrivals_flowing(10, 0, 900, 2901, 3600, 3600)


def test_not_flowing_once_the_chunk_end_passed_or_when_empty():
    assert not streams.arrivals_flowing(100, 0, 3599, 3600, 3600, 3600)
    assert not streams.arrivals_flowing(0, 0, 0, 1, 3600, 3600)


def test_expected_final_size_extrapolates_the_mean_rate():
    # 100 items over 99 s, 3500 s left: 100 + (100/99) * 3500
    assert streams.expected_final_size(100, 0, 99, 100, 3600, 3600) == pytest.approx(100 + 100 / 99 * 3500)
    # one batch: its rate is read over the minimum silence (30 s), not as infinite
    assert streams.expected_final_size(3000, 5, 5, 6, 3600, 3600) == pytest.approx(3000 + 100 * 3594)
    # silent for longer than the threshold, or past the end: no more items expected
    assert streams.expected_final_size(3000, 5, 5, 36, 3600, 3600) == 3000
    assert streams.expected_final_size(100, 0, 99, 3700, 3600, 3600) == 100


def test_target_labels_is_neyman_without_fpc_hand_case():
    # K=2, N=[100,100], no labels: S = sqrt(q(1-q)) = [0.5, 0.3]; W = 1/2 each
    # n*_k = z^2 (sum W S) W_k S_k margin / delta^2
    z2 = z_value(0.95) ** 2
    want = [z2 * 0.4 * 0.5 * s * STOPPING_VARIANCE_MARGIN / 0.05 ** 2 for s in (0.5, 0.3)]
    got = streams.target_labels([100, 100], [0, 0], [0, 0], [0.5, 0.9], 0.05, 0.95)
    assert got == pytest.approx(want)
    assert want[0] == pytest.approx(159.04, abs=0.01)


def test_target_labels_with_fpc_hand_case():
    # same strata: n* = (sum W S)^2 / (delta^2 / (z^2 margin) + sum W S^2 / N), N = 200
    V = 0.05 ** 2 / (z_value(0.95) ** 2 * STOPPING_VARIANCE_MARGIN)
    total = 0.4 ** 2 / (V + (0.5 * 0.25 + 0.5 * 0.09) / 200)
    got = streams.target_labels([100, 100], [0, 0], [0, 0], [0.5, 0.9], 0.05, 0.95, fpc=True)
    assert got == pytest.approx([total * 0.25 / 0.4, total * 0.15 / 0.4])
    assert got.sum() < streams.target_labels([100, 100], [0, 0], [0, 0], [0.5, 0.9], 0.05, 0.95).sum()


def test_target_labels_has_two_per_nonempty_stratum_and_none_for_empty():
    got = streams.target_labels([1000, 0, 1000], [0, 0, 0], [0, 0, 0], [1.0, 0.5, 1.0], 0.05, 0.95)
    assert got.tolist() == [2.0, 0.0, 2.0]


def test_target_labels_learns_from_labels():
    # 90 labels, 45 positive, prior 0.99: pseudo_smoothed = (45 + 9.9) / 100 = 0.549
    got = streams.target_labels([100], [90], [45], [0.99], 0.05, 0.95)
    p = 0.549
    assert got[0] == pytest.approx(z_value(0.95) ** 2 * p * (1 - p) * STOPPING_VARIANCE_MARGIN / 0.05 ** 2)


def test_paced_thresholds_take_a_share_of_the_target_and_never_decrease():
    tau = streams.paced_thresholds([0.5, 0.0, 0.0], [1000, 1000, 0], [100, 100, 5])
    assert tau.tolist() == pytest.approx([0.5, streams.PACE_SHARE * 0.1, 0.0])
    assert streams.paced_thresholds([0.0], [10], [100]).tolist() == [1.0]


def test_threshold_after_takes_the_next_lowest_priorities():
    assert streams.threshold_after(0.1, [0.5, 0.2, 0.3], 2) == 0.3
    assert streams.threshold_after(0.1, [0.5, 0.2, 0.3], 5) == 0.5
    assert streams.threshold_after(0.1, [0.5, 0.2], 0) == 0.1
    assert streams.threshold_after(0.1, [], 3) == 0.1


def test_plan_paces_while_flowing_and_runs_rounds_once_stopped():
    N, n, h, q = np.full(4, 900.0), np.zeros(4), np.zeros(4), np.array([0.6, 0.75, 0.9, 0.98])
    tau, want = streams.plan_requests(N, n, h, q, np.zeros(4), 4 * N, True, True, False, 0.02, 0.95, 8)
    assert want.tolist() == [0, 0, 0, 0]
    assert tau == pytest.approx(streams.PACE_SHARE * streams.target_labels(4 * N, n, h, q, 0.02, 0.95, fpc=True)
                                / (4 * N))
    tau, want = streams.plan_requests(N, n, h, q, np.zeros(4), N, False, True, False, 0.02, 0.95, 8)
    assert tau.tolist() == [0, 0, 0, 0] and want.tolist() == [2, 2, 2, 2]
    # once closed, a round takes half of what the half-width says is missing
    n, h = np.full(4, 20.0), np.array([12.0, 15.0, 18.0, 20.0])
    _, want = streams.plan_requests(N, n, h, q, np.zeros(4), N, False, True, False, 0.02, 0.95, 8, closed=True)
    assert want.sum() == streams.shortfall_round(8, N, n, h, q, 0.02, 0.95, True) > 8
    # a round still pending, or converged: no new round
    assert streams.plan_requests(N, n, h, q, np.zeros(4), N, False, False, False, 0.02, 0.95, 8)[1].sum() == 0
    assert streams.plan_requests(N, n, h, q, np.zeros(4), N, False, True, True, 0.02, 0.95, 8)[1].sum() == 0


def test_plan_is_vectorised_over_runs():
    N = np.full((3, 2), 500.0)
    tau, want = streams.plan_requests(N, np.zeros((3, 2)), np.zeros((3, 2)), np.full((3, 2), 0.8), np.zeros((3, 2)),
                                      N * 2, np.array([True, False, False]), np.array([True, True, False]),
                                      np.array([False, False, False]), 0.05, 0.95, 4)
    assert want.sum(axis=-1).tolist() == [0, 4, 0]
    assert (tau[0] > 0).all() and (tau[1:] == 0).all()


def test_open_interval_has_no_fpc_and_never_zero_width():
    # every arrived item labelled: with the fpc this would be exact (zero width)
    N, n, h = [9], [9], [8]
    open_iv = streams.chunk_interval(N, n, h, 0.95, closed=False)
    closed_iv = streams.chunk_interval(N, n, h, 0.95, closed=True)
    assert open_iv.halfwidth > 0.1
    assert closed_iv.halfwidth < open_iv.halfwidth
    mixed = streams.chunk_interval([[9], [9]], [[9], [9]], [[8], [8]], 0.95, np.array([False, True]))
    assert mixed.halfwidth.tolist() == pytest.approx([float(open_iv.halfwidth), float(closed_iv.halfwidth)])


def test_budget_allowance_accrues_over_the_hour():
    # 50 + 450 * s / 3600, rounded up: the whole budget during the hour's last second
    assert lifecycle.budget_allowance(500, [0, 1, 1800, 3599, 3600]).tolist() == [50, 51, 275, 500, 500]
    assert lifecycle.budget_allowance(7, [0, 3600]).tolist() == [1, 7]


def test_labels_to_reach_inverts_the_closed_interval():
    # one stratum at p = 1/2 (h = n/2, so the half-label guard changes nothing), N so large the fpc is nil:
    # the design-effect Wilson half-width is (z/2) / sqrt(n_eff + z^2) with n_eff = (n - 1) / margin,
    # so it reaches delta at n = 1 + margin * (z^2 / (4 delta^2) - z^2)
    z, m = 1.959963984540054, STOPPING_VARIANCE_MARGIN
    want = 1 + m * (z * z / (4 * 0.05**2) - z * z)  # 394.62
    assert streams.labels_to_reach([1e9], [100.0], [50.0], 0.05, 0.95) == pytest.approx(want, rel=1e-4)
    # already narrow enough, or no interval yet: today's labels
    assert streams.labels_to_reach([1e9], [1000.0], [500.0], 0.05, 0.95) == 1000
    assert streams.labels_to_reach([1e9, 10.0], [100.0, 1.0], [50.0, 1.0], 0.05, 0.95) == 101
    # never more than the chunk holds
    assert streams.labels_to_reach([150.0], [100.0], [50.0], 0.001, 0.95) == pytest.approx(150)


def test_shortfall_round_takes_half_of_what_is_missing_once_closed():
    z, m = 1.959963984540054, STOPPING_VARIANCE_MARGIN
    missing = 1 + m * (z * z / (4 * 0.05**2) - z * z) - 100  # 294.6 (above)
    N, n, h = [1e9], [100.0], [50.0]
    q = [0.5]  # a prior at the labels' own proportion: the projection holds p = 1/2
    assert streams.shortfall_round(8, N, n, h, q, 0.05, 0.95, closed=True) == np.ceil(streams.SHORTFALL_SHARE * missing)
    assert streams.shortfall_round(8, N, n, h, q, 0.05, 0.95, closed=False) == 8  # open: Bennett & Carvalho's 2K
    assert streams.shortfall_round(8, N, [390.0], [195.0], q, 0.05, 0.95, closed=True) == 8  # never below 2K
    got = streams.shortfall_round(8, [N, N], [n, n], [h, h], [q, q], 0.05, 0.95, np.array([True, False]))
    assert got.tolist() == [148, 8]
    # two labels that disagree in a stratum the scores put at 0.99: projected at (1 + 10 * 0.99) / 12, not 1/2
    # (with the growth cap lifted: two labels allow a round of 16 at most, below both forecasts)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(streams, "SHORTFALL_GROWTH", np.inf)
        sure, unsure = (streams.shortfall_round(8, [1e9], [2.0], [1.0], [p], 0.05, 0.95, True) for p in ([0.99], [0.5]))
    assert 16 < sure < unsure


def test_shortfall_round_grows_the_labels_at_most_eightfold():
    """A chunk that closes with the two-label warm-up of its four strata is short of about 600
    labels at delta 0.02; its round is 8 x 8 = 64, not 320 split on two labels a stratum."""
    N, q = [5e4] * 4, [0.6, 0.9, 0.99, 0.999]
    warm_up, labelled = ([2.0] * 4, [1.0, 2.0, 2.0, 2.0]), ([25.0] * 4, [12.0, 22.0, 25.0, 25.0])
    capped = [streams.shortfall_round(8, N, n, h, q, 0.02, 0.95, closed=True) for n, h in (warm_up, labelled)]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(streams, "SHORTFALL_GROWTH", np.inf)
        free = [streams.shortfall_round(8, N, n, h, q, 0.02, 0.95, closed=True) for n, h in (warm_up, labelled)]
    assert capped[0] == streams.SHORTFALL_GROWTH * 8 == 64 < free[0]
    assert capped[1] == free[1] < 800  # 100 labels may take up to 800: half of what is missing


def test_shortfall_round_is_not_capped_for_recall_or_f1():
    """Accuracy is capped as precision is; with recall or F1 enabled a round takes half of what
    is missing (docs/development/label-efficiency.md "Rounds after the close": the cap cost them labels)."""
    from stratameter.stats.target import Target

    N, n, h, q = [5e4] * 4, [2.0] * 4, [1.0, 2.0, 0.0, 1.0], [0.6, 0.9, 0.05, 0.3]
    side = [True, True, False, False]
    rounds = {m: int(streams.shortfall_round(8, N, n, h, q, 0.02, 0.95, True, Target(m, side))[()])
              for m in (("accuracy",), ("recall",), ("f1",), ("precision", "recall"))}
    assert rounds[("accuracy",)] == 64
    assert all(rounds[m] > 64 for m in (("recall",), ("f1",), ("precision", "recall"))), rounds


def test_status():
    s = lifecycle.chunk_status([2, 1, 2, 0, 0, 3], [0.01, 0.01, 0.03, 0.05, 0.05, 0.01], 0.02, 2,
                             [False, False, False, True, False, True], [False, False, False, True, True, True],
                             [False, False, True, False, False, True])
    assert s.tolist() == ["converged", "open", "waiting_for_budget", "exhausted", "open", "converged"]
    assert lifecycle.chunk_status(5, float("nan"), 0.02, 2, False, False, False) == "open"


def test_catch_up_takes_a_labelled_stratum_to_most_of_the_closed_chunks_target():
    # one stratum, N = 1000, 40 labels with 20 positive: p = (20.5)/41 = 1/2
    N, n, h = [1000.0], [40.0], [20.0]
    closed = streams.target_labels(N, n, h, [0.5], 0.05, 0.95, fpc=True)[0]
    assert streams.catch_up(N, n, h, [0.99], 0.05, 0.95)[0] == np.ceil(streams.CATCH_UP_SHARE * closed - 40)
    # by hand: z = 1.95996, V = 0.05^2 / (z^2 margin), n0 = 0.25 / V, with the correction n0 / (1 + n0 / 1000)
    z = 1.959963984540054
    n0 = 0.25 * z * z * STOPPING_VARIANCE_MARGIN / 0.05**2
    assert closed == pytest.approx(n0 / (1.0 + n0 / 1000.0))
    assert closed < streams.target_labels(N, n, h, [0.5], 0.05, 0.95)[0]  # not the open chunk's


def test_catch_up_leaves_thinly_labelled_strata_to_ordinary_rounds_and_never_exceeds_the_stratum():
    got = streams.catch_up([1000.0, 50.0], [streams.CATCH_UP_MIN_LABELS - 1, 40.0], [5.0, 20.0], [0.5, 0.5],
                           0.01, 0.95)
    assert got[0] == 0  # too few labels to trust their spread
    assert got[1] == 10  # Neyman's share of the small stratum is more than it has left (54.8 of 50)
    assert streams.catch_up([1000.0], [600.0], [300.0], [0.5], 0.05, 0.95)[0] == 0  # already past its target


def test_the_loop_samples_the_newest_started_chunks_and_the_older_ones_still_kept():
    # chunks of 60 s; at t = 185 s chunk 3 (180-240 s) has started, chunk 4 has not
    assert lifecycle.sampled_chunks([4, 0, 2, 3, 1], 60, 185.0) == [2, 3]  # retention 2: the active two
    assert lifecycle.sampled_chunks([4, 0, 2, 3, 1], 60, 185.0, retention=4) == [1, 2, 3]  # 1..4 kept
    assert lifecycle.sampled_chunks([4, 0, 2, 3, 1], 60, 185.0, retention=24) == [0, 1, 2, 3]
    # the newest two started are sampled whatever the retention
    assert lifecycle.sampled_chunks([4, 0, 2, 3, 1], 60, 185.0, retention=1) == [2, 3]
    assert lifecycle.sampled_chunks([3], 60, 185.0) == [3]
    assert lifecycle.sampled_chunks([4], 60, 185.0) == []


def test_a_closed_chunk_the_loop_left_below_target_is_stopped():
    assert lifecycle.final_status("open", closed=True, sampled=False) == "stopped"
    assert lifecycle.final_status("waiting_for_budget", closed=True, sampled=False) == "stopped"
    # still sampled, or still open for late records, or done: unchanged
    assert lifecycle.final_status("open", closed=True, sampled=True) == "open"
    assert lifecycle.final_status("open", closed=False, sampled=False) == "open"
    for done in ("converged", "exhausted"):
        assert lifecycle.final_status(done, closed=True, sampled=False) == done
    assert "stopped" in lifecycle.STATUSES


def test_catch_up_for_recall_waits_for_enough_labelled_positives():
    """Recall's catch-up reads its gradients off the labelled positives: with fewer than
    CATCH_UP_MIN_POSITIVES in the chunk it takes nothing (the ordinary rounds go on); from then on the
    same labels as without the rule.  Precision's catch-up does not wait."""
    target = Target(("recall",), np.array([True, True, False, False]))
    N, n, q = np.array([2000.0, 2000.0, 50_000.0, 50_000.0]), np.full(4, 80.0), np.full(4, 0.5)
    few, enough = np.array([30.0, 38.0, 2.0, 0.0]), np.array([60.0, 37.0, 2.0, 1.0])  # 70 and 100 positives
    assert enough.sum() == streams.CATCH_UP_MIN_POSITIVES
    assert streams.catch_up(N, n, few, q, 0.05, 0.95, target).tolist() == [0, 0, 0, 0]
    assert streams.catch_up(N, n, enough, q, 0.05, 0.95, target).sum() > 0
    half = np.array([20.0, 20.0, 20.0, 19.0])  # 79 positives in 40 labels a stratum
    assert streams.catch_up(N, np.full(4, 40.0), half, q, 0.02, 0.95).min() > 0  # precision's does not wait


def test_a_chunk_short_of_positives_waits_for_half_of_those_it_holds():
    """A short chunk may hold fewer than 2 x CATCH_UP_MIN_POSITIVES positives: it waits for half the
    positives its strata are estimated to hold, sum N_k (h_k + 1/2) / (n_k + 1).  By hand, strata of
    60, 60, 500 and 500 items with 45, 45, 30 and 30 labels: 10, 10, 0, 0 positives estimate
    60 x 21/46 + 500 x 1/31 = 43.52, half 21.8 > 20 labelled (not yet); 20, 18, 1, 0 estimate
    60 x 39/46 + 500 x 2/31 = 83.13, half 41.6 > 39 (not yet); 40, 40, 0, 0 estimate
    60 x 81/46 + 500 x 1/31 = 121.78, half 60.9 <= 80 (ready, with fewer than CATCH_UP_MIN_POSITIVES)."""
    N, n = np.array([60.0, 60.0, 500.0, 500.0]), np.array([45.0, 45.0, 30.0, 30.0])
    p = lambda h: (np.asarray(h, float) + 0.5) / (n + 1)  # noqa: E731 (the labels' rates, as catch_up takes them)
    for h, ready in (([10, 10, 0, 0], False), ([20, 18, 1, 0], False), ([40, 40, 0, 0], True)):
        assert bool(streams.enough_positives(N, np.array(h, float), p(h))[0]) is ready, h
    assert np.isclose((N * p([40, 40, 0, 0])).sum(), 60 * 81 / 46 + 500 / 31)
    big = N * 100  # a chunk 100 x as large: 100 labelled positives, as before
    assert not streams.enough_positives(big, np.array([40.0, 40, 0, 0]), p([40, 40, 0, 0]))[0]
    assert streams.enough_positives(big, np.array([45.0, 45, 5, 5]), p([45, 45, 5, 5]))[0]


ALLOWANCE_NOW_MS = 500_000 * 3_600_000 + 1_800_999  # 1,800.999 s into a clock hour


def test_the_allowance_at_an_instant_is_in_whole_seconds_into_the_hour():
    """0.1 of 3,600 at the top of the hour, then 0.9 of it accruing: 360 + 3,240 x 1,800 / 3,600 =
    1,980, not the 1,981 that 1,800.999 s would give; all of it in the hour's last millisecond."""
    hour = 500_000 * 3_600_000
    assert lifecycle.allowance_at(3600, ALLOWANCE_NOW_MS) == 1980
    assert lifecycle.allowance_at(3600, hour) == 360 and lifecycle.allowance_at(3600, hour + 3_600_000 - 1) == 3600
