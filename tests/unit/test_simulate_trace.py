"""Tests of the gauge trace of `stratameter simulate --stream --trace` (service/simulate/trace.py,
`stream.run_stream(gauge_seconds=...)`): its timing, that it leaves the runs alone, that each reading is
the interval of the chunk's counts at that moment and its truth the precision of the items arrived by
then, the summary's arithmetic, the estimate at a run's stop, and one seeded measurement of the bias
of the gauge's estimate (marked slow)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stratameter.chunks import lifecycle
from stratameter.simulate import populations as P
from stratameter.simulate import stream, trace
from stratameter.stats import streams

POP = P.builtin("calibrated")


def settings(**kw) -> stream.StreamSettings:
    return stream.StreamSettings(**{"delta": 0.05, "chunk_seconds": 600.0, "lateness": 60.0, **kw})


@pytest.mark.slow
def test_readings_every_30_s_until_each_run_stops_and_the_runs_unchanged():
    s = settings()
    plain = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 6, seed=21)
    r = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 6, seed=21, gauge_seconds=30.0)
    for f in ("labels", "estimate", "lower", "upper", "stop_seconds", "status"):
        assert np.array_equal(getattr(plain, f), getattr(r, f))  # the trace draws nothing, changes nothing
    g = r.gauge
    J = int(r.stop_seconds.max() // 30)
    assert g.seconds.tolist() == [30.0 * (j + 1) for j in range(J)]
    assert g.minute[:2].tolist() == [0.5, 1.0]
    assert g.estimate.shape == g.lower.shape == g.upper.shape == g.truth.shape == g.taken.shape == (6, J)
    assert g.estimate.dtype == np.float32
    assert np.array_equal(g.taken, g.seconds[None, :] <= r.stop_seconds[:, None])
    assert np.all(np.isnan(g.estimate[~g.taken])) and np.all(np.isnan(g.truth[~g.taken]))
    # null while a non-empty stratum has fewer than two labels: a bound is null exactly when the estimate is
    assert np.array_equal(np.isnan(g.estimate), np.isnan(g.lower)) and np.array_equal(np.isnan(g.estimate),
                                                                                      np.isnan(g.upper))
    assert np.isnan(g.estimate[:, 0]).all()  # 30 s in: no strata yet (the first 100 arrivals)
    shown = np.isfinite(g.estimate)
    assert shown.any() and np.all(g.lower[shown] <= g.upper[shown])
    # each run's last reading (after the close) refers to the whole chunk
    last = g.taken.sum(axis=1) - 1
    rows = np.arange(6)
    assert np.all(g.seconds[last] >= s.chunk_seconds + s.lateness)
    assert np.allclose(g.truth[rows, last], r.truth, atol=1e-6)
    # read on the loop's own grid (5 s), the last reading is at the stop: the final interval, with the
    # plain estimate (a scrape is not a reading at the stopping rule's stop); every 6th is a 30 s one
    g5 = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 6, seed=21, gauge_seconds=5.0).gauge
    last5 = g5.taken.sum(axis=1) - 1
    assert np.array_equal(g5.seconds[last5], r.stop_seconds)
    final = streams.chunk_interval(r.N, r.n, r.h, s.confidence, True)
    assert np.allclose(g5.lower[rows, last5], final.lower, atol=1e-6)
    assert np.allclose(g5.estimate[rows, last5], final.estimate, atol=1e-6)
    assert np.array_equal(g5.seconds[5::6][:J], g.seconds)
    for f in ("estimate", "lower", "upper", "truth", "taken"):
        assert np.array_equal(getattr(g5, f)[:, 5::6][:, :J], getattr(g, f), equal_nan=f != "taken")


def test_truth_so_far_on_a_tiny_chunk():
    """A dozen items: the truth of a reading is the share of positives among the items arrived by then."""
    pop = P.Population("tiny", np.array([0.6, 0.7, 0.8, 0.9]), np.array([0, 1, 1, 1], dtype=np.int8))
    s = settings(chunk_seconds=120.0, rate=0.1, lateness=0.0)
    r = stream.run_stream(pop, stream.SCENARIOS["slow"], s, 2, seed=3, gauge_seconds=30.0, keep_items=True)
    c, g = r.chunks, r.gauge
    for run in range(2):
        block = slice(run * c.M, (run + 1) * c.M)
        a, y = c.a[block], c.y[block]
        for j, t in enumerate(g.seconds):
            if not g.taken[run, j]:
                continue
            arrived = a <= t
            expected = y[arrived].sum() / arrived.sum() if arrived.any() else math.nan
            assert g.truth[run, j] == pytest.approx(expected, nan_ok=True)
    # by hand: run 0's arrivals and labels, in arrival order
    order = np.argsort(c.a[:c.M])
    a0, y0 = c.a[:c.M][order], c.y[:c.M][order]
    a0, y0 = a0[np.isfinite(a0)], y0[np.isfinite(a0)]
    at_60 = y0[a0 <= 60].mean() if (a0 <= 60).any() else math.nan
    assert g.truth[0, 1] == pytest.approx(at_60, nan_ok=True)
    assert np.allclose(g.truth[:, -1][g.taken[:, -1]], r.truth[g.taken[:, -1]])


def rebuilt(r, s):
    """Per reading of `r` (run with keep_items): the plain interval of the chunk's counts then, rebuilt
    from the items (arrived by t: N; requested and answered by t: n, h, an answer landing at the first
    step at or after its delay; the fpc once closed), and its labels."""
    c, g, dt = r.chunks, r.gauge, s.step_seconds
    lands = r.requested_at + np.maximum(1, np.ceil(np.minimum(c.delay, s.label_timeout) / dt - 1e-9)) * dt
    answered = r.requested & ~c.skip
    for run in range(c.runs):
        block = slice(run * c.M, (run + 1) * c.M)
        k, a, y = c.stratum[block], c.a[block], c.y[block]
        count = lambda m: np.bincount(k[m], minlength=c.K + 1)[:c.K]  # noqa: E731,B023
        for j, t in enumerate(g.seconds):
            if g.taken[run, j]:
                got = answered[block] & (lands[block] <= t)
                N, n, h = count(a <= t), count(got), count(got & (y == 1))
                iv = streams.chunk_interval(N[None].astype(float), n[None], h[None], s.confidence,
                                            bool(lifecycle.is_closed(t, s.chunk_seconds, s.lateness)))
                yield run, j, iv, int(n.sum())


def test_a_reading_is_the_interval_of_the_counts_at_its_time():
    s = settings(chunk_seconds=900.0, lateness=120.0)
    r = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 3, seed=5, gauge_seconds=30.0, keep_items=True)
    g, checked = r.gauge, 0
    for run, j, iv, _ in rebuilt(r, s):
        if np.isfinite(iv.lower[0]):
            checked += 1
            assert g.estimate[run, j] == pytest.approx(iv.estimate[0], abs=1e-6)
            assert g.lower[run, j] == pytest.approx(iv.lower[0], abs=1e-6)
            assert g.upper[run, j] == pytest.approx(iv.upper[0], abs=1e-6)
        else:
            assert np.isnan(g.estimate[run, j])
    assert checked > 20


@pytest.mark.slow
def test_with_the_calibration_the_gauge_shows_the_difference_estimator_where_active():
    """Below `calibration_min_labels` labels a reading is the plain interval; above, the difference
    estimator's where its switch keeps it (some readings differ), never null where the plain one is not."""
    s = settings(chunk_seconds=900.0, lateness=120.0, calibration_min_labels=30)
    r = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 2, seed=5, gauge_seconds=30.0, keep_items=True)
    g, differ = r.gauge, 0
    for run, j, iv, labels in rebuilt(r, s):
        assert np.isfinite(g.lower[run, j]) == np.isfinite(iv.lower[0])
        same = g.lower[run, j] == pytest.approx(iv.lower[0], abs=1e-6, nan_ok=True)
        if labels < 30:
            assert same
        differ += not same
    assert differ > 5


def test_summary_pools_readings_with_run_clustered_errors_and_picks_the_minutes():
    sec = np.array([300.0, 600.0, 900.0])
    est = np.array([[0.5, 0.6, np.nan], [0.7, np.nan, np.nan]], dtype=np.float32)
    truth = np.array([[0.4, 0.7, 0.5], [0.6, 0.6, np.nan]], dtype=np.float32)
    g = trace.GaugeTrace(300.0, sec, est, est - 0.15, est + 0.05, truth,
                         np.array([[True, True, True], [True, True, False]]))
    t = trace.summarise(g, minutes=(5, 10, 30))
    assert t.readings == 5 and t.no_interval == 2
    assert t.bias.readings == 3 and t.bias.mean == pytest.approx(0.1 / 3, abs=1e-6)
    # run sums 0.1 - 0.1 = 0 over 2 readings, 0.1 over 1: sqrt(2 ((0 - 2m)^2 + (0.1 - m)^2)) / 3
    m = 0.1 / 3
    assert t.bias.se == pytest.approx(math.sqrt(2 * ((2 * m) ** 2 + (0.1 - m) ** 2)) / 3, rel=1e-5)
    assert t.coverage.mean == pytest.approx(2 / 3)  # 0.7 is outside [0.45, 0.65]
    assert set(t.at_minute) == {5, 10}  # no reading at minute 30
    assert t.at_minute[5]["bias"].mean == pytest.approx(0.1, abs=1e-6) and t.at_minute[5]["bias"].readings == 2
    assert t.at_minute[10]["no_interval"] == 1 and t.at_minute[10]["coverage"].mean == 0.0
    both = trace.GaugeTrace.concat([g, trace.GaugeTrace(300.0, sec[:1], est[:1, :1], est[:1, :1], est[:1, :1],
                                                        truth[:1, :1], np.ones((1, 1), dtype=bool))])
    assert both.estimate.shape == (3, 3) and not both.taken[2, 1:].any()


def test_estimate_at_stop_where_converged_and_the_plain_one_elsewhere():
    s = settings()
    r = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 20, seed=9)
    iv = streams.chunk_interval(r.N, r.n, r.h, s.confidence, True)
    conv = r.status == "converged"
    assert conv.any()
    assert np.array_equal(r.estimate, np.where(conv, iv.estimate_at_stop, iv.estimate), equal_nan=True)


@pytest.mark.slow
def test_gauge_estimate_is_unbiased_for_the_items_arrived_so_far():
    """The gauge of a slow stream on `calibrated` at delta 0.05, read every 30 s over 300 chunks of an
    hour: |mean(estimate - precision of the items arrived so far)| <= 0.005 + 2 s.e. (clustered by
    run) over every reading with an interval; its interval covers that precision at least as often as
    its nominal 95 % less 2 s.e."""
    s = stream.StreamSettings(delta=0.05)
    r = stream.run_stream(POP, stream.SCENARIOS["slow"], s, 300, seed=2024, gauge_seconds=30.0)
    t = trace.summarise(r.gauge)
    assert t.bias.readings > 20_000
    assert abs(t.bias.mean) <= 0.005 + 2 * t.bias.se, t
    assert t.coverage.mean >= 0.95 - 2 * t.coverage.se, t
