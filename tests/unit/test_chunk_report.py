"""`chunks.report`: the one place a chunk's reported intervals and status are decided, by hand,
and the half-width the loop stops on equal to the widest interval the API reports."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.chunks.report import StrataColumns, chunk_report
from stratameter.stats import confusion, streams
from stratameter.stats.target import Target
from stratameter.stats.difference import Calibrated
from stratameter.stats.estimator import Interval

#: two predicted-positive strata, then two predicted-negative ones
COLUMNS = StrataColumns(np.array([400.0, 600, 3000, 1000]), np.array([40.0, 60, 50, 30]),
                        np.array([36.0, 30, 2, 6]), np.array([True, True, False, False]))


def test_each_metric_is_the_plain_interval_and_the_top_level_is_precisions():
    report = chunk_report(COLUMNS, ["precision", "recall"], 0.95, closed=False)
    c = COLUMNS
    for m in ("precision", "recall"):
        expected = confusion.metric_interval(m, c.N, c.n, c.h, c.positive, 0.95, fpc=False)
        assert float(report.intervals[m].lower) == pytest.approx(float(expected.lower))
        assert float(report.intervals[m].upper) == pytest.approx(float(expected.upper))
    assert report.precision is report.intervals["precision"]
    widths = {m: float(iv.upper - iv.lower) / 2 for m, iv in report.intervals.items()}
    assert report.widest == max(widths, key=widths.get) and report.halfwidth == pytest.approx(max(widths.values()))


def test_precision_not_enabled_is_still_reported_from_the_positives_alone():
    report = chunk_report(COLUMNS, ["recall"], 0.95, closed=True)
    pos = COLUMNS.positive
    expected = confusion.metric_interval("precision", COLUMNS.N[pos], COLUMNS.n[pos], COLUMNS.h[pos], pos[pos], 0.95,
                                         fpc=True)
    assert float(report.precision.estimate) == pytest.approx(float(expected.estimate))
    assert list(report.intervals) == ["recall"]


def test_incomplete_negatives_null_the_metrics_that_need_them_and_a_lost_chunk_nulls_all():
    partial = chunk_report(COLUMNS, ["precision", "recall"], 0.95, False, negatives_complete=False)
    assert partial.intervals["recall"] is None and partial.intervals["precision"] is not None
    assert np.isnan(partial.halfwidth)  # recall has a population: the rule cannot stop on precision alone
    lost = chunk_report(COLUMNS, ["precision", "recall"], 0.95, False, complete=False)
    assert lost.precision is None and all(iv is None for iv in lost.intervals.values())


@pytest.mark.parametrize("recorded, closed, judged, delta, sampled, told", [
    ("converged", False, False, 0.5, True, "converged"),
    ("converged", False, False, 0.01, True, "open"),        # wider than delta now
    ("converged", True, False, 0.5, True, "open"),          # closed, not judged closed yet
    ("converged", True, True, 0.5, True, "converged"),
    ("waiting_for_budget", False, False, 0.5, True, "waiting_for_budget"),
    ("open", True, True, 0.5, False, "stopped"),            # closed and no longer sampled
    ("exhausted", True, True, 0.5, False, "exhausted"),
    ("open", False, False, 0.5, False, "open"),
])
def test_the_status_a_reader_is_told(recorded, closed, judged, delta, sampled, told):
    report = chunk_report(COLUMNS, ["precision", "recall"], 0.95, closed)
    assert report.status(recorded, judged, delta, sampled) == told


def _calibrated(plain: Interval, stderr: float, active: bool) -> Calibrated:
    difference = Interval(plain.estimate, plain.estimate - 0.01, plain.estimate + 0.01, np.float64(stderr))
    return Calibrated(difference if active else plain, plain, difference, None, 130, active,
                      spread_ratio=np.array([0.5, 0.5, 0.9, 0.9]))


def test_an_active_difference_estimator_replaces_the_plain_interval_and_sizes_the_rounds():
    plain = chunk_report(COLUMNS, ["precision", "recall"], 0.95, False)
    p = plain.intervals["recall"]
    calibration = {"recall": _calibrated(p, float(p.stderr) / 2, True),
                   "precision": _calibrated(plain.intervals["precision"], 0.01, False)}
    report = chunk_report(COLUMNS, ["precision", "recall"], 0.95, False, calibration)
    assert report.intervals["recall"] is calibration["recall"].interval
    assert report.intervals["precision"] is not calibration["precision"].difference
    assert report.widest == "precision"  # recall's is now +-0.01
    assert report.variance_ratio == 1.0 and report.allocation_scale is None
    only = chunk_report(COLUMNS, ["recall"], 0.95, False, {"recall": calibration["recall"]})
    assert only.variance_ratio == pytest.approx(0.25)
    assert only.allocation_scale.tolist() == [0.5, 0.5, 0.9, 0.9]


def test_the_half_width_the_loop_stops_on_is_the_widest_the_api_reports():
    """Random chunks: `ChunkReport.halfwidth` equals the widest populated interval the design's
    target gives (`streams.chunk_interval` with a `Target`), NaN where one is undefined."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        k = rng.integers(1, 4, size=2)
        positive = np.repeat([True, False], k)
        N = rng.integers(0, 400, size=positive.size).astype(float)
        n = np.minimum(N, rng.integers(0, 40, size=positive.size))
        h = np.floor(n * rng.random(positive.size))
        closed = bool(rng.random() < 0.5)
        metrics = ["precision", "recall", "f1", "accuracy"][:rng.integers(1, 5)]
        if metrics == ["precision"]:
            metrics = ["precision", "accuracy"]
        report = chunk_report(StrataColumns(N, n, h, positive), metrics, 0.95, closed)
        expected = float(streams.chunk_interval(N, n, h, 0.95, closed, Target(metrics, positive)).halfwidth)
        if np.isnan(expected):
            assert np.isnan(report.halfwidth)
        else:
            assert report.halfwidth == pytest.approx(expected)
