"""A metric pooled over independent stratified samples, each drawn by its own adaptive design: the
estimate of a window of chunks (`chunks.window`).

Each chunk is a stratified sample of its own items, so the (chunk, stratum) cells are the strata of
one stratified sample of the window's items, and the stratified estimator and its variance apply
over them (Cochran 1977, *Sampling Techniques*, 3rd ed., Sec. 5.3-5.4: strata sampled
independently).  What does not carry over is the adaptive-bias correction.  A chunk's labels were
allocated by tracking its own labels and stopped by its own variance, so each cell's proportion
``h/n`` is biased to first order, and a chunk's interval removes that bias with shifts computed in
its own frame: its strata's weights and the variance its stopping rule tested
(`estimator.adaptive_bias_corrected`).  The same shifts computed in the window's frame are wrong:
the stopping rule's term ``g_k^2 / (n_k v)`` with the window's weights and variance is about
``1/C`` of the chunk's over ``C`` chunks, and the bias left does not shrink with ``C`` while the
standard error does.  So each cell's proportion is corrected in its chunk's frame
(`corrected_means`: the shifts the chunk's own interval for the metric applies), and the window's
estimate is the metric of the corrected proportions over the pooled cells; for precision and
accuracy, the chunks' own estimates weighted by their populations.  The shifts are taken as the
chunk's design took its decisions, while it was open: without the finite population correction,
which leaves a closed chunk's share of the bias visible once many closed chunks are pooled
(docs/concepts/windows.md measures both).

The variance is the linearised one over the cells at their half-label proportions, each cell with
its chunk's finite population correction once that chunk has closed (its population is then final);
the interval is the chunk's family around the estimate (`estimator.wilson_design_effect` for the
stratified means, the ratio metrics' effective size at their guarded metric, `confusion`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .confusion import (
    RATIO_METRICS,
    correct_counts,
    population,
    ratio_shifts,
    ratio_wilson,
    side_slopes,
    value_of_totals,
)
from .estimator import (
    Interval,
    half_label_smoothed,
    stratum_variances,
    undefined_interval,
    wilson_design_effect,
    z_value,
)
from .moments import StratumMoments
from .wilson import Draws, Strata, guarded_variance, mean_shifts


@dataclass(frozen=True)
class CorrectedMeans:
    """Per stratum of one sample (last axis), its labels' proportion with the adaptive-bias shifts of
    its own interval for a metric: with the stopping rule's term (a reading at the rule's stop) and
    with the allocation's alone (a reading at any moment), clipped into [0, 1]."""

    at_stop: np.ndarray
    now: np.ndarray

    def reading(self, stopped) -> np.ndarray:
        """`at_stop` where `stopped` (broadcast against the strata), `now` elsewhere."""
        return np.where(stopped, self.at_stop, self.now)


def corrected_means(metric: str, N, n, h, positive) -> CorrectedMeans:
    """`CorrectedMeans` of one sample's strata for `metric`: the shifts `confusion.metric_interval`
    applies to them (precision: its predicted positives' strata as a stratified mean, the others
    left plain; accuracy: the proportions of correct predictions; recall, F1: `confusion.ratio_shifts`),
    taken without the finite population correction, as the design took its decisions while the
    chunk was open (docs/decisions/window-pooling.md).  Rows where the metric has no population get
    no shift (they weigh nothing when pooled)."""
    fpc = False
    N, n, h = (np.asarray(x, dtype=float) for x in (N, n, h))
    pos = np.asarray(positive, dtype=bool)
    p = h / np.maximum(n, 1.0)
    empty = population(metric, N, pos) <= 0
    N = np.where(np.asarray(empty)[..., None], 1.0, N)  # a stand-in: its shifts are dropped below
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric in RATIO_METRICS:
            shifted = ratio_shifts(metric, N, StratumMoments.of_counts(n, h), h, pos, fpc)
            at_stop, now = shifted.at_stop, shifted.now
        elif metric == "accuracy":  # a stratified mean of "the prediction was right"
            right = correct_counts(n, h, pos)
            at_stop, now = _mean_shifts(N, n, right, fpc)
            at_stop, now = (np.where(pos, s, -s) for s in (at_stop, now))
        else:
            at_stop, now = np.zeros_like(p), np.zeros_like(p)
            at_stop[..., pos], now[..., pos] = _mean_shifts(N[..., pos], n[..., pos], h[..., pos], fpc)
    keep = ~np.asarray(empty)[..., None]
    return CorrectedMeans(*(np.clip(p + np.where(keep, np.nan_to_num(s), 0.0), 0.0, 1.0) for s in (at_stop, now)))


def _mean_shifts(N, n, h, fpc: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per stratum, the shifts of a stratified mean's proportions (`wilson.mean_shifts` with weights
    ``W_k^2`` and the variance at the half-label proportions: `estimator.wilson_interval`'s)."""
    total = N.sum(axis=-1, keepdims=True)
    S, D = Strata(N, N / np.where(total > 0, total, 1.0)), Draws(n, h)
    return mean_shifts(S, D, D.p * (1.0 - D.p), S.W2, guarded_variance(S, D, fpc), fpc)


@dataclass(frozen=True)
class CellSums:
    """What a window's interval for one metric needs of some of its cells, summed over them: per side
    of the threshold (last axis: the predicted positives' cells, then the predicted negatives'; any
    leading axes are rows), the items ``sum N_k``, the corrected positives at the rule's stop and as
    read (``sum N_k p_k`` with `CorrectedMeans`' proportions), the positives at the half-label
    proportions (``sum N_k pbar_k``), the spread ``sum N_k^2 Var_k`` (`estimator.stratum_variances` at
    those proportions, with the finite population correction in a closed chunk's cells), the labels,
    and whether a cell with items has no label.  Sums of disjoint cells add (`+`): a window's
    closed chunks are summed once (`api.window_cells`) and its open chunk's added at each scrape.

    Every figure of `interval_of_sums` is a function of these sums: the metric of the totals
    (``TP``, ``FN``, `confusion.value_of_totals`), and the linearised variance, whose gradient is
    ``N_k`` times a slope of its side (`confusion.side_slopes`), so that ``sum_k g_k^2 Var_k`` is
    ``sum_side slope^2 * spread``."""

    items: np.ndarray
    at_stop: np.ndarray
    reading: np.ndarray
    smooth: np.ndarray
    spread: np.ndarray
    labels: np.ndarray
    missing: np.ndarray

    @classmethod
    def stacked(cls, rows: list["CellSums | None"]) -> "CellSums":
        """Sums of one group each, stacked as rows (None: a group of no cell, all zero)."""
        none = cls(*(np.zeros(2, dtype=bool if f == "missing" else float) for f in _SUMS))
        rows = [none if x is None else x for x in rows]
        return cls(*(np.stack([getattr(x, f) for x in rows]) for f in _SUMS))

    def row(self, r: int) -> "CellSums":
        """The sums of row `r` (sums over cells that carry a leading axis of rows)."""
        return CellSums(*(getattr(self, f)[r] for f in _SUMS))

    def __add__(self, other: "CellSums") -> "CellSums":
        return CellSums(*(np.logical_or(a, b) if f == "missing" else a + b
                          for f, a, b in ((f, getattr(self, f), getattr(other, f)) for f in _SUMS)))


_SUMS = ("items", "at_stop", "reading", "smooth", "spread", "labels", "missing")


def cell_sums(N, n, h, positive, closed, means: CorrectedMeans, stopped) -> CellSums:
    """The `CellSums` of cells (last axis): their items `N`, labels `n`, positive labels `h`, whether
    they hold predicted `positive`s, whether their chunk has `closed`, their chunks' `means`
    (`corrected_means`, side by side) and whether their chunk's loop has `stopped` on the rule (its
    reading is then at the stop)."""
    N, n, h = (np.asarray(x, dtype=float) for x in (N, n, h))
    pos = np.asarray(positive, dtype=bool)
    p_var = half_label_smoothed(n, h)
    var_k = np.where(closed, stratum_variances(N, n, p_var, True), stratum_variances(N, n, p_var, False))
    with np.errstate(invalid="ignore"):  # inf x 0 in an empty cell: it has no spread
        spread = np.where(N > 0, N * N * var_k, 0.0)
    per_cell = (N, N * means.at_stop, N * means.reading(stopped), N * np.clip(p_var, 1e-9, 1.0 - 1e-9), spread, n,
                (n == 0) & (N > 0))
    return CellSums(*(np.stack([np.sum(np.where(side, x, 0), axis=-1) for side in (pos, ~pos)], axis=-1)
                      for x in per_cell))


def interval_of_sums(metric: str, sums: CellSums, confidence: float) -> Interval:
    """`metric`'s interval from its cells' `CellSums` (module docstring): the bounds around the
    estimate at the rule's stop (as a chunk's are, `estimator.Interval`), the estimate the cells'
    readings.  Undefined where the metric has no population; NaN bounds where a cell of the metric
    has fewer than 2 labels."""
    n_pos, n_all = sums.items[..., 0], sums.items.sum(axis=-1)
    empty = (n_pos if metric == "precision" else n_all) <= 0
    if np.all(empty):
        return undefined_interval(np.shape(empty))
    counted = slice(0, 1) if metric == "precision" else slice(0, 2)
    missing = sums.missing[..., counted].any(axis=-1)

    def metric_of(positives) -> np.ndarray:
        return value_of_totals(metric, positives[..., 0], positives[..., 1], n_pos, n_all)

    slopes = [np.nan_to_num(np.asarray(a, dtype=float), nan=0.0, posinf=0.0, neginf=0.0)
              for a in side_slopes(metric, sums.smooth[..., 0], sums.smooth[..., 1], n_pos, n_all)]
    with np.errstate(invalid="ignore"):  # a side with no slope: its spread (maybe inf) does not count
        var = sum(np.where(a != 0.0, a * a * sums.spread[..., i], 0.0) for i, a in enumerate(slopes))
    est, now = (np.where(missing, np.nan, metric_of(x)) for x in (sums.at_stop, sums.reading))
    labels = sums.labels[..., counted].sum(axis=-1)
    z = z_value(confidence)
    if metric not in RATIO_METRICS:
        iv = wilson_design_effect(est, var, labels, z, now)
    else:  # the effective size at the guarded metric, as a chunk's
        iv = ratio_wilson(est, now, metric_of(sums.smooth), var, labels, z)
    return iv.undefined_where(empty) if np.any(empty) else iv
