"""`chunks.window`: a window pools its chunks as strata of one stratified sample (stratum x chunk
cells), by hand and by simulation (bias and coverage against the pooled truth), and never pools a
chunk that cannot be estimated honestly."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.chunks.report import StrataColumns, chunk_report
from stratameter.chunks.window import (WindowPart, format_duration, parse_duration, window_chunks, window_lengths,
                                       window_report)
from stratameter.stats import allocation, confusion


def _part(t, N, n, h, positive=None, **kw):
    positive = np.ones(len(N), bool) if positive is None else np.asarray(positive)
    return WindowPart(t, StrataColumns(np.asarray(N, float), np.asarray(n, float), np.asarray(h, float), positive),
                      **kw)


def test_a_window_is_the_stratified_estimate_over_its_cells_by_hand():
    """Two closed chunks of two strata each: the pooled precision is each chunk's own estimate (its
    adaptive terms computed in its own frame, as while it was sampled: without the finite population
    correction) weighted by its share of the items, 0.4 and 0.6 here;
    its variance is sum_c,k (N_ck/N)^2 (1 - n_ck/N_ck) s_ck^2 / n_ck over the four cells at their
    half-label proportions, which is sum_c w_c^2 v_c; labels and items add up."""
    a = _part(10, [100, 300], [10, 20], [9, 10], closed=True)
    b = _part(11, [200, 400], [10, 30], [10, 12], closed=True)
    window = window_report([b, a], ["precision"], 0.95)
    assert window.chunks == (10, 11) and window.labels == 70 and window.population == 1000 and window.complete
    own = [confusion.metric_interval("precision", p.columns.N, p.columns.n, p.columns.h, p.columns.positive, 0.95,
                                     fpc=False) for p in (a, b)]  # the adaptive terms without the correction
    iv = window.intervals["precision"]
    assert float(iv.estimate) == pytest.approx(0.4 * float(own[0].estimate) + 0.6 * float(own[1].estimate))
    assert float(iv.estimate_at_stop) == pytest.approx(0.4 * float(own[0].at_stop) + 0.6 * float(own[1].at_stop))
    cells = [(100, 10, 9), (300, 20, 10), (200, 10, 10), (400, 30, 12)]
    by_hand = sum((N / 1000) ** 2 * (1 - n / N) * n / (n - 1) * (h + .5) / (n + 1) * (1 - (h + .5) / (n + 1)) / n
                  for N, n, h in cells)
    assert float(iv.stderr) ** 2 == pytest.approx(by_hand)
    closed = [window_report([p], ["precision"], 0.95).intervals["precision"].stderr for p in (a, b)]
    assert float(iv.stderr) ** 2 == pytest.approx(0.16 * float(closed[0]) ** 2 + 0.36 * float(closed[1]) ** 2)
    plain = (100 * 0.9 + 300 * 0.5 + 200 * 1.0 + 400 * 0.4) / 1000  # 0.6, the plain stratified mean
    assert abs(float(iv.estimate) - plain) < 0.02


def test_a_window_of_one_chunk_reports_what_the_chunk_reports():
    """Every metric, read at any moment and at the rule's stop: a window of one open chunk is the
    chunk's own report (`chunk_report`); of one closed chunk, the same estimates (the adaptive terms
    taken without the finite population correction, `stats.pooled`) with the closed chunk's variance,
    on 100 random chunks of positive and negative strata."""
    rng = np.random.default_rng(3)
    metrics = ["precision", "recall", "f1", "accuracy"]
    positive = np.array([True, True, True, False, False, False])
    for _ in range(100):
        N = rng.integers(20, 2000, 6).astype(float)
        n = np.minimum(N, rng.integers(2, 80, 6)).astype(float)
        h = np.floor(n * rng.uniform(0, 1, 6))
        columns = StrataColumns(N, n, h, positive)
        still = chunk_report(columns, metrics, 0.95, closed=False).intervals
        shut = chunk_report(columns, metrics, 0.95, closed=True).intervals
        for closed in (False, True):
            for stopped in (False, True):
                pooled = window_report([WindowPart(1, columns, closed, stopped=stopped)], metrics, 0.95).intervals
                for m in metrics:
                    a, b = still[m], pooled[m]
                    read = a.estimate_at_stop if stopped else a.estimate
                    same = [(a.estimate_at_stop, b.estimate_at_stop), ((shut if closed else still)[m].stderr, b.stderr)]
                    if not closed:
                        same += [(read, b.estimate), (a.lower, b.lower), (a.upper, b.upper)]
                    for x, y in same:
                        assert float(y) == pytest.approx(float(x), abs=1e-12, nan_ok=True), (m, closed, stopped)


def test_a_closed_chunks_cells_carry_the_finite_population_correction_an_open_ones_none():
    """A closed chunk's population is final, an open one's still grows: in a window of one of each
    the variance is the closed chunk's corrected one plus the open chunk's uncorrected one, each
    weighted by its squared share of the items; an open chunk with no item changes nothing."""
    shut = _part(1, [50, 50], [40, 40], [20, 30], closed=True)
    still = _part(2, [100, 100], [40, 40], [20, 30], closed=False)
    window = window_report([shut, still], ["precision"], 0.95).intervals["precision"]
    v = [float(window_report([p], ["precision"], 0.95).intervals["precision"].stderr) ** 2 for p in (shut, still)]
    assert float(window.stderr) ** 2 == pytest.approx(v[0] / 9 + 4 * v[1] / 9)
    assert v[0] < float(window_report([_part(1, [50, 50], [40, 40], [20, 30], closed=False)], ["precision"],
                                      0.95).intervals["precision"].stderr) ** 2
    empty = window_report([shut, _part(3, [0, 0], [0, 0], [0, 0], closed=False)], ["precision"], 0.95)
    assert float(empty.intervals["precision"].halfwidth) == pytest.approx(
        float(window_report([shut], ["precision"], 0.95).intervals["precision"].halfwidth))


def test_a_chunk_that_lost_records_or_negatives_is_named_never_pooled_silently():
    both = [True, True, False, False]
    ok = _part(1, [100, 100, 500, 500], [10, 10, 10, 10], [8, 9, 1, 0], both, closed=True, negatives_complete=True)
    partial = _part(2, [100, 100, 500, 500], [10, 10, 10, 10], [8, 9, 1, 0], both, closed=True,
                    negatives_complete=False)
    window = window_report([ok, partial], ["precision", "recall"], 0.95)
    assert window.intervals["recall"] is None and window.intervals["precision"] is not None
    assert window.incomplete_chunks == (2,) and not window.complete
    lost = window_report([ok, _part(3, [10, 10], [2, 2], [1, 1], closed=True, complete=False)], ["precision"], 0.95)
    assert lost.intervals["precision"] is None and lost.incomplete_chunks == (3,)


def _adaptive_chunk(rng, N, labels_of, q, total: int = 60):
    """One chunk sampled as the service samples it: two labels a stratum, then rounds of six by
    online OPT (`allocation.allocate_opt_track`), each label the next item of a random order of the
    stratum (a simple random sample given the stratum's count).  Returns (n, h)."""
    n = np.full(N.size, 2)
    while n.sum() < total:
        h = np.array([labels_of[k][:n[k]].sum() for k in range(N.size)])
        n = n + allocation.allocate_opt_track(N, n, h, q, 6, with_replacement=False)
    return n, np.array([labels_of[k][:n[k]].sum() for k in range(N.size)])


@pytest.mark.slow
def test_window_coverage_and_bias_by_simulation():
    """2000 windows of 4 chunks x 3 strata, each chunk's proportions drifting, each chunk sampled
    adaptively as the service does (`_adaptive_chunk`): the 95 % interval covers the pooled truth in
    0.93-0.975 of them (binomial s.e. 0.005), the estimate's bias is within 0.005, and the window's
    half-width is about half a single chunk's (four chunks' labels)."""
    rng = np.random.default_rng(11)
    covered, errors, widths, single = 0, [], [], []
    runs = 2000
    q = np.array([0.55, 0.8, 0.95])
    for _ in range(runs):
        parts, truth_pos, truth_n = [], 0, 0
        for t in range(4):
            N = rng.integers(200, 2000, size=3)
            p = np.clip(q + rng.normal(0, 0.03, 3), 0, 1)
            pos = rng.binomial(N, p)
            labels_of = [rng.permutation(np.arange(N[k]) < pos[k]) for k in range(3)]
            n, h = _adaptive_chunk(rng, N, labels_of, q)
            parts.append(_part(t, N, n, h, closed=True))
            truth_pos, truth_n = truth_pos + pos.sum(), truth_n + N.sum()
        iv = window_report(parts, ["precision"], 0.95).intervals["precision"]
        truth = truth_pos / truth_n
        covered += float(iv.lower) <= truth <= float(iv.upper)
        errors.append(float(iv.estimate) - truth)
        widths.append(float(iv.halfwidth))
        single.append(float(window_report(parts[-1:], ["precision"], 0.95).intervals["precision"].halfwidth))
    assert 0.93 <= covered / runs <= 0.975
    assert abs(np.mean(errors)) <= 0.005
    assert 0.4 <= np.mean(widths) / np.mean(single) <= 0.6


def test_the_chunks_of_a_window_and_durations():
    assert window_chunks(10, [3, 7, 8, 9, 10, 11], 3) == [8, 9, 10]
    assert window_chunks(10, [3, 10], 3) == [10] and window_chunks(None, [1, 2], 3) == []
    assert [parse_duration(d) for d in ("3600", "30s", "15m", "24h", "7d")] == [3600, 30, 900, 86400, 604800]
    assert [format_duration(s) for s in (86400, 5400, 90, 3600)] == ["1d", "90m", "90s", "1h"]
    assert window_lengths("1h,1d", 3600) == {"1h": 1, "1d": 24} and window_lengths("", 3600) == {}
    for bad in ("", "0h", "1w", "h", "-5", "1.5h"):
        with pytest.raises(ValueError):
            parse_duration(bad)


def test_many_windows_at_once_are_each_window_alone():
    """Columns with a leading axis of rows (`simulate --stream --chunks` pools many readings' windows
    in one call): each row's interval, labels and items are those of its window alone, and a chunk
    with no item (a window's slot before the stream's first chunk) changes nothing."""
    rng = np.random.default_rng(7)
    rows = 5
    N = rng.integers(50, 500, (3, rows, 4)).astype(float)
    n = rng.integers(2, 40, (3, rows, 4)).astype(float)
    h = np.floor(n * rng.uniform(0.5, 1.0, (3, rows, 4)))
    N[0] = n[0] = h[0] = 0.0  # the first slot: no chunk yet
    ones = np.ones(4, bool)
    many = window_report([WindowPart(t, StrataColumns(N[t], n[t], h[t], ones), False) for t in range(3)],
                         ["precision"], 0.95)
    for r in range(rows):
        alone = window_report([WindowPart(t, StrataColumns(N[t, r], n[t, r], h[t, r], ones), False) for t in (1, 2)],
                              ["precision"], 0.95)
        a, b = alone.intervals["precision"], many.intervals["precision"]
        for field in ("estimate", "lower", "upper", "stderr", "estimate_at_stop"):
            assert float(getattr(b, field)[r]) == pytest.approx(float(getattr(a, field)), abs=1e-12), field
        assert (many.labels[r], many.population[r]) == (alone.labels, alone.population)
