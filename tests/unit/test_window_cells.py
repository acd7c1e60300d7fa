"""`api.window_cells`: a scrape pools the cells of a window's closed chunks as remembered with the
open chunks' (`chunks.window.pooled_report`), and the figures are those of the window's chunks
pooled at once (`window_report`) but for the order of the additions; the memory holds a window's closed cells only while its
closed chunks are what they were, and is bounded."""

from __future__ import annotations

import numpy as np
import pytest

from stratameter.api.window_cells import ClosedCells
from stratameter.chunks import lifecycle
from stratameter.chunks.report import StrataColumns
from stratameter.chunks.window import WindowPart, pooled_report, window_cells, window_report
from stratameter.config import load_settings
from stratameter.state.records import ChunkState

pytestmark = pytest.mark.unit

METRICS = ("precision", "recall", "f1", "accuracy")
FIELDS = ("estimate", "lower", "upper", "stderr", "estimate_at_stop")


def _chunk(rng, t: int, closed: bool, strata: int, negatives: int) -> WindowPart:
    """A chunk of `strata` predicted positives' strata and `negatives` predicted negatives' ones, at
    least 2 labels each, its loop stopped on the rule or not."""
    k = strata + negatives
    N = rng.integers(20, 400, k).astype(float)
    n = np.minimum(rng.integers(2, 30, k), N).astype(float)
    h = np.floor(n * rng.uniform(0.0, 1.0, k))
    positive = np.arange(k) < strata
    return WindowPart(t, StrataColumns(N, n, h, positive), closed, stopped=bool(rng.random() < 0.5))


@pytest.mark.parametrize("seed", range(6))
def test_closed_cells_pooled_with_the_open_ones_are_the_window_at_once(seed):
    """24 chunks, the 22 oldest closed; the strata alike (the corrected means in one call over the
    chunks) or not (one frozen chunk of one stratum: a call per chunk): every metric's figures equal
    to 1e-12 (sums of sums add in another order), labels and items exactly."""
    rng = np.random.default_rng(seed)
    mixed = seed % 2 == 1
    parts = [_chunk(rng, t, t < 22, 1 if mixed and t == 5 else 4, 4) for t in range(24)]
    rng.shuffle(parts)  # any order: a window sorts its chunks
    at_once = window_report(parts, METRICS, 0.95)
    closed = [p for p in parts if p.closed]
    split = pooled_report([window_cells(closed, METRICS), window_cells([p for p in parts if not p.closed], METRICS)],
                          METRICS, 0.95)
    assert split.chunks == at_once.chunks == tuple(range(24))
    assert (split.labels, split.population, split.incomplete_chunks) == (at_once.labels, at_once.population, ())
    for m in METRICS:
        for field in FIELDS:
            a, b = getattr(at_once.intervals[m], field), getattr(split.intervals[m], field)
            assert float(b) == pytest.approx(float(a), abs=1e-12, nan_ok=True), (m, field, a, b)


def test_a_chunk_that_cannot_be_pooled_nulls_the_window_split_or_not():
    rng = np.random.default_rng(3)
    parts = [_chunk(rng, t, t < 3, 4, 4) for t in range(4)]
    lost = WindowPart(1, parts[1].columns, True, complete=False)
    partial = WindowPart(2, parts[2].columns, True, negatives_complete=False)
    for bad in (lost, partial):
        mixed = [p if p.chunk != bad.chunk else bad for p in parts]
        at_once = window_report(mixed, METRICS, 0.95)
        split = pooled_report([window_cells(mixed[:3], METRICS), window_cells(mixed[3:], METRICS)], METRICS, 0.95)
        assert split.incomplete_chunks == at_once.incomplete_chunks == (bad.chunk,)
        assert {m for m, iv in split.intervals.items() if iv is None} == \
            {m for m, iv in at_once.intervals.items() if iv is None}


def _state(t: int, n: list[int], status: str = "open") -> ChunkState:
    return ChunkState(t, np.array([0.6, 0.7, 0.8]), np.full(4, 100.0), np.asarray(n, float), np.ones(4),
                      status=status)


def test_the_closed_cells_are_remembered_while_their_chunks_are_what_they_were():
    memory, built = ClosedCells(size=2), []

    def parts(states):
        def build():
            built.append(1)
            return [WindowPart(cs.chunk, StrataColumns(cs.N, cs.n, cs.h, np.ones(4, bool)), True) for cs in states]
        return build

    a, b = _state(1, [2, 2, 2, 2]), _state(2, [3, 3, 3, 3])
    inputs = ((1, a, None, True, None), (2, b, None, True, None))
    first = memory.cells(("p", "c", 24), inputs, parts([a, b]), ("precision",))
    assert memory.cells(("p", "c", 24), inputs, parts([a, b]), ("precision",)) is first and len(built) == 1
    again = _state(2, [3, 3, 3, 3])  # read whole again, the same counts: still current
    assert memory.cells(("p", "c", 24), ((1, a, None, True, None), (2, again, None, True, None)), parts([a, again]),
                        ("precision",)) is first and len(built) == 1
    for changed in (_state(2, [3, 4, 3, 3]), _state(2, [3, 3, 3, 3], status="converged")):  # a label; the rule
        inputs = ((1, a, None, True, None), (2, changed, None, True, None))
        assert memory.cells(("p", "c", 24), inputs, parts([a, changed]), ("precision",)) is not first
    assert len(built) == 3
    memory.cells(("p", "c", 24), ((1, a, None, False, None), (2, changed, None, True, None)), parts([a, changed]),
                 ("precision",))
    assert len(built) == 4  # chunk 1's records found lost since: computed again
    assert memory.cells(("p", "c", 24), ((2, changed, None, True, None),), parts([changed]), ("precision",)).chunks \
        == (2,)  # the window moved on an hour
    for cid in ("d", "e"):
        memory.cells(("p", cid, 24), inputs, parts([a, changed]), ("precision",))
    assert len(memory._cells) == 2  # bounded: the least recently used out


def test_the_chunks_closed_among_many_are_those_closed_each():
    cfg = load_settings({}).for_classifier("c")
    now = 1_800_000_000.0 + 250.0
    ids = list(range(int(now) // 3600 - 5, int(now) // 3600 + 2))
    assert lifecycle.closed_among(ids, cfg, now) == {t for t in ids if lifecycle.chunk_closed(t, cfg, now)}
    assert lifecycle.closed_among([], cfg, now) == set()


def test_windows_pooled_together_are_each_window_alone():
    """`pooled_reports` (a scrape's windows, the open chunks of windows alike in one call): each
    window's figures equal to 1e-12 to its own `pooled_report`, whether it has closed chunks or not,
    open chunks of other strata, or a chunk that cannot be pooled; labels, items and chunks exactly."""
    from stratameter.chunks.window import PendingWindow, pooled_reports

    rng = np.random.default_rng(11)
    windows = []
    for w in range(12):
        closed = [_chunk(rng, t, True, 4, 4) for t in range(w % 4)]
        if w == 5:
            closed[0] = WindowPart(0, closed[0].columns, True, complete=False)
        opened = [_chunk(rng, 10, False, 2 if w % 5 == 3 else 4, 4)]
        if w == 7:
            opened = [WindowPart(10, opened[0].columns, False, negatives_complete=False)]
        windows.append(PendingWindow(window_cells(closed, METRICS) if closed else None, opened))
    together = pooled_reports(windows, METRICS, 0.95)
    for w, report in zip(windows, together):
        alone = pooled_report([g for g in [w.closed] if g is not None] + [window_cells(w.open_parts, METRICS)],
                              METRICS, 0.95)
        assert (report.chunks, report.labels, report.population, report.incomplete_chunks) == \
            (alone.chunks, alone.labels, alone.population, alone.incomplete_chunks)
        for m in METRICS:
            a, b = alone.intervals[m], report.intervals[m]
            assert (a is None) == (b is None), m
            for field in FIELDS if a is not None else ():
                assert float(getattr(b, field)) == pytest.approx(float(getattr(a, field)), abs=1e-12, nan_ok=True)
