"""A window: the reported chunk and the chunks before it, pooled into one estimate.

Each chunk is an independent stratified sample of its own items (its strata, boundaries and
inclusion thresholds its own).  The window's items are the union of its chunks' items, so the
window is one stratified population whose strata are the (chunk, stratum) cells, and the chunks'
samples together are a stratified sample of it (Cochran 1977, *Sampling Techniques*, 3rd ed.,
Sec. 5.3-5.4: strata sampled independently; each cell's sample a simple random sample of the cell
given its size, `stats.streams`).  Each cell's proportion is corrected for its chunk's adaptive
design in the chunk's own frame, and the metric, its variance and its interval are taken over the
cells (`stats.pooled`): the same family as a chunk's (Wilson with the design effect, the half-label
guard); a window of one open chunk reports what the chunk reports.

A closed chunk's cells carry the finite population correction (its population is final), an open
chunk's none.  The difference estimator is not pooled: a window reports the plain stratified
estimator in every cell.

A chunk that cannot be estimated honestly is never pooled silently: one some of whose records were
counted in a state Redis lost (`complete` false) makes every metric of the window null, and one whose
predicted negatives did not all reach their state (`negatives_complete` false) the metrics that need
them; the window names those chunks.
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import numpy as np

from ..stats.confusion import needs_negatives
from ..stats.estimator import Interval
from ..stats.pooled import CellSums, CorrectedMeans, cell_sums, corrected_means, interval_of_sums
from .report import StrataColumns


@dataclass(frozen=True)
class WindowPart:
    """One chunk of a window: its strata's columns, whether it has closed and whether its loop has
    stopped on the rule (each one bool, or per row where the columns have rows), and whether it can
    be pooled."""

    chunk: int
    columns: StrataColumns
    closed: bool | np.ndarray
    complete: bool = True
    negatives_complete: bool | None = None  # None: the metrics need no predicted negatives
    stopped: bool | np.ndarray = False  # its status is ``converged``: it is read at the rule's stop

    def per_cell(self, flag) -> np.ndarray:
        """A flag of the chunk (one bool, or per row) for each of its cells."""
        return np.broadcast_to(np.asarray(flag, dtype=bool)[..., None], np.shape(self.columns.n))


@dataclass(frozen=True)
class WindowReport:
    """The pooled figures of a window's chunks (`window_report`)."""

    chunks: tuple[int, ...]  # the chunks pooled, oldest first
    intervals: dict[str, Interval | None]  # every enabled metric's; None where it cannot be estimated
    labels: int
    population: int
    #: the chunks that made a metric null: some of their records lost, or their negatives incomplete
    incomplete_chunks: tuple[int, ...]

    @property
    def complete(self) -> bool:
        return not self.incomplete_chunks


def window_report(parts: list[WindowPart], metrics, confidence: float) -> WindowReport:
    """Every enabled metric's interval over the cells of `parts` (module docstring).  The parts'
    columns may carry a leading axis of rows, the same windows' cells read at many moments or in
    many runs (`chunk_report`); ``labels`` and ``population`` are then per row."""
    return pooled_report([window_cells(parts, metrics)] if parts else [], metrics, confidence)


@dataclass(frozen=True)
class WindowCells:
    """Some chunks of a window, as `pooled_report` pools them: each metric's sums over their cells
    (`stats.pooled.CellSums` of the proportions corrected in each chunk's own frame, `_means`; none
    for a metric their own chunks already make null), their labels and items, and the chunks that
    cannot be pooled.  The sums of a window's closed chunks do not change while their labels and
    statuses do not: `api.window_cells` keeps them between scrapes."""

    chunks: tuple[int, ...]
    sums: dict[str, CellSums]
    labels: int | np.ndarray
    population: int | np.ndarray
    lost: tuple[int, ...]
    partial: tuple[int, ...]


def window_cells(parts: list[WindowPart], metrics) -> WindowCells:
    """The `WindowCells` of `parts` (at least one) for `metrics`."""
    parts = sorted(parts, key=lambda p: p.chunk)
    lost = tuple(p.chunk for p in parts if not p.complete)
    partial = tuple(p.chunk for p in parts if p.negatives_complete is False)
    cells = StrataColumns(*(np.concatenate([getattr(p.columns, c) for p in parts], axis=-1)
                            for c in ("N", "n", "h", "positive")))
    closed, stopped = (np.concatenate([p.per_cell(getattr(p, f)) for p in parts], axis=-1)
                       for f in ("closed", "stopped"))
    sums = {m: cell_sums(cells.N, cells.n, cells.h, cells.positive, closed, _means(parts, m), stopped)
            for m in metrics if not (lost or (partial and needs_negatives([m])))}
    return WindowCells(tuple(p.chunk for p in parts), sums, _total(cells.n), _total(cells.N), lost, partial)


def pooled_report(groups: list[WindowCells], metrics, confidence: float) -> WindowReport:
    """`window_report` over the chunks of `groups` (`window_cells` of disjoint runs of a window's
    chunks): their sums added (`stats.pooled.CellSums`), the same figures as over their parts at
    once up to the order of the additions."""
    metrics = tuple(metrics)
    if not groups:
        return WindowReport((), dict.fromkeys(metrics), 0, 0, ())
    lost = tuple(t for g in groups for t in g.lost)
    partial = tuple(t for g in groups for t in g.partial)
    intervals: dict[str, Interval | None] = {}
    for m in metrics:
        if lost or (partial and needs_negatives([m])):
            intervals[m] = None
            continue
        intervals[m] = interval_of_sums(m, functools.reduce(operator.add, (g.sums[m] for g in groups)), confidence)
    named = lost or (partial if any(needs_negatives([m]) for m in metrics) else ())
    return WindowReport(tuple(sorted(t for g in groups for t in g.chunks)), intervals, sum(g.labels for g in groups),
                        sum(g.population for g in groups), tuple(sorted(set(named))))


@dataclass(frozen=True)
class PendingWindow:
    """A window to pool later with others (`pooled_reports`): its closed chunks' `WindowCells` (None
    if it has none) and its open chunks' parts."""

    closed: WindowCells | None
    open_parts: list[WindowPart]


def pooled_reports(windows: list[PendingWindow], metrics, confidence: float) -> list[WindowReport]:
    """`pooled_report` of each window, the open chunks of windows alike computed in one call: their
    columns stacked as rows (windows whose open chunks have the same strata, none of them a chunk that
    cannot be pooled), what a scrape of many classifiers does instead of one window at a time."""
    metrics = tuple(metrics)
    out: list[WindowReport | None] = [None] * len(windows)
    alike: dict[tuple, list[int]] = {}
    for i, w in enumerate(windows):
        poolable = w.closed is None or not (w.closed.lost or w.closed.partial)
        if poolable and w.open_parts and all(p.complete and p.negatives_complete is not False for p in w.open_parts):
            shape = tuple((p.columns.n.shape, p.columns.positive.tobytes()) for p in w.open_parts)
            alike.setdefault(shape, []).append(i)
        else:
            out[i] = pooled_report([g for g in [w.closed] if g is not None] + (
                [window_cells(w.open_parts, metrics)] if w.open_parts else []), metrics, confidence)
    for rows in alike.values():
        for i, report in zip(rows, _stacked([windows[i] for i in rows], metrics, confidence)):
            out[i] = report
    return out  # type: ignore[return-value]


def _stacked(windows: list[PendingWindow], metrics: tuple[str, ...], confidence: float) -> list[WindowReport]:
    """`pooled_reports` of windows whose open chunks have the same strata and whose chunks can all be
    pooled: the open parts' columns and flags stacked (one row a window), each window's closed sums
    stacked alike, added, and every metric's interval computed over the rows at once."""
    first = windows[0].open_parts
    stacked = [WindowPart(q, StrataColumns(*(np.stack([getattr(w.open_parts[q].columns, f) for w in windows])
                                             for f in ("N", "n", "h")), first[q].columns.positive),
                          np.array([bool(w.open_parts[q].closed) for w in windows]),
                          stopped=np.array([bool(w.open_parts[q].stopped) for w in windows]))
               for q in range(len(first))]
    opened = window_cells(stacked, metrics)
    intervals = {m: interval_of_sums(m, opened.sums[m] + CellSums.stacked(
        [w.closed.sums[m] if w.closed is not None else None for w in windows]), confidence) for m in metrics}
    reports = []
    for r, w in enumerate(windows):
        held = (w.closed.chunks, w.closed.labels, w.closed.population) if w.closed is not None else ((), 0, 0)
        reports.append(WindowReport(tuple(sorted(held[0] + tuple(p.chunk for p in w.open_parts))),
                                    {m: iv.row(r) for m, iv in intervals.items()},
                                    int(opened.labels[r]) + held[1], int(opened.population[r]) + held[2], ()))
    return reports


def _means(parts: list[WindowPart], metric: str) -> CorrectedMeans:
    """The parts' strata's proportions, each corrected in its own chunk's frame and without the
    finite population correction (`stats.pooled.corrected_means`), side by side as the cells are:
    in one call where the parts have the same strata (the chunk as a leading axis)."""
    cols = [p.columns for p in parts]
    if len({(c.n.shape, c.positive.tobytes()) for c in cols}) == 1:
        N, n, h = (np.stack([getattr(c, f) for c in cols]) for f in ("N", "n", "h"))
        means = corrected_means(metric, N, n, h, cols[0].positive)
        side_by_side = lambda x: np.concatenate(list(x), axis=-1)  # noqa: E731  (chunks, ..., K) -> (..., C K)
        return CorrectedMeans(side_by_side(means.at_stop), side_by_side(means.now))
    each = [corrected_means(metric, c.N, c.n, c.h, c.positive) for c in cols]
    return CorrectedMeans(*(np.concatenate([getattr(x, f) for x in each], axis=-1) for f in ("at_stop", "now")))


def _total(x: np.ndarray):
    """A column's sum over the cells: an int, or per row where the columns have rows."""
    return int(x.sum()) if x.ndim == 1 else x.sum(axis=-1)


def window_chunks(reported: int | None, held: list[int], length: int) -> list[int]:
    """The chunks of a window `length` chunks long: the reported chunk and the `length` - 1 chunk
    ids before it, those of them that are `held` (a chunk with no record has no state)."""
    if reported is None:
        return []
    wanted = set(range(reported - length + 1, reported + 1))
    return [t for t in sorted(held) if t in wanted]


#: a duration's units, largest first (`parse_duration`, `format_duration`)
UNITS = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))


def parse_duration(text: str) -> int:
    """Whole seconds of a duration written as seconds (``"3600"``) or with a unit (``"30s"``,
    ``"15m"``, ``"24h"``, ``"7d"``); ValueError naming the text otherwise."""
    t = text.strip().lower()
    scale = dict(UNITS).get(t[-1:], None) if t[-1:].isalpha() else 1
    digits = t[:-1] if t[-1:].isalpha() else t
    if scale is None or not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"a duration is a whole number > 0 of seconds, or with a unit s, m, h or d, got {text!r}")
    return int(digits) * scale


def format_duration(seconds: int) -> str:
    """`seconds` in the largest unit that writes it whole (86400 -> ``"1d"``, 5400 -> ``"90m"``)."""
    for unit, size in UNITS:
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    raise AssertionError("unreachable: every whole number of seconds is whole in seconds")


def window_lengths(windows: str, chunk_seconds: int) -> dict[str, int]:
    """The configured windows (`STRATAMETER_WINDOWS`, canonical: `duration_list`): name -> chunks."""
    return {name: parse_duration(name) // chunk_seconds for name in windows.split(",") if name}
