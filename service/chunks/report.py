"""What one chunk reports: every enabled metric's interval, the top-level precision figures, the
half-width the stopping rule reads, and the status a reader is told.

The one place these are decided.  The API and the gauges (`api.views`) build a chunk's document
from a `ChunkReport`; the request loop (`requests.loop`) sizes and stops its rounds on the same
report of the strata it samples, so what the loop stops on is what an operator reads.

A metric's interval is the plain stratified one (`stats.confusion.metric_interval`: Wilson with
the design effect, Bennett & Carvalho 2010 eq. 3 for precision) unless the difference estimator
is active for it (`stats.difference.Calibrated`, from `labels.calibrated.chunk_calibrations`), and
is undefined (None) for a metric that cannot be estimated honestly from the chunk: one that needs
the predicted negatives when some of them never reached their state, or every metric of a chunk
some of whose records were counted in a state Redis lost (`lifecycle.counted_whole`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..stats import confusion
from ..stats.confusion import needs_negatives
from ..stats.difference import Calibrated
from ..stats.estimator import Interval


@dataclass(frozen=True)
class StrataColumns:
    """Per stratum of a chunk (the predicted positives' strata first): items ``N``, labels ``n``,
    labelled positives ``h``, and whether the stratum holds predicted positives."""

    N: np.ndarray
    n: np.ndarray
    h: np.ndarray
    positive: np.ndarray


@dataclass(frozen=True)
class ChunkReport:
    """A chunk's reported figures (`chunk_report`)."""

    #: every enabled metric's reported interval; None where it cannot be estimated
    intervals: dict[str, Interval | None]
    #: the top-level figures: precision's interval (None where it cannot be estimated)
    precision: Interval | None
    #: the metrics with a population in the chunk (`confusion.population`): those the stopping rule reads
    populated: tuple[str, ...]
    closed: bool
    calibration: dict[str, Calibrated] = field(default_factory=dict)

    @property
    def widest(self) -> str | None:
        """The populated metric with the widest interval (an undefined one is the widest), or None."""
        widths = {m: _halfwidth(self.intervals[m]) for m in self.populated}
        if not widths:
            return None
        return max(widths, key=lambda m: np.nan_to_num(widths[m], nan=np.inf))

    @property
    def halfwidth(self) -> float:
        """The half-width the stopping rule reads: the widest populated metric's; NaN while any of
        them is undefined or none has a population."""
        widest = self.widest
        return np.nan if widest is None else _halfwidth(self.intervals[widest])

    @property
    def variance_ratio(self) -> float:
        """The widest interval's variance over the plain estimator's (1 unless the difference
        estimator is active for it): the share of the plain design's labels it needs."""
        active = self._active(self.widest)
        return 1.0 if active is None else active.variance_ratio

    @property
    def allocation_scale(self) -> np.ndarray | None:
        """Per stratum, the widest metric's residual spread over its labels' (`Calibrated.allocation_scale`)
        where the difference estimator is active for it, else None."""
        active = self._active(self.widest)
        return None if active is None else active.allocation_scale

    def narrow(self, delta: float) -> bool:
        """Every populated metric's interval is defined and at most `delta` wide each side."""
        widths = [_halfwidth(self.intervals[m]) for m in self.populated]
        return all(np.isfinite(hw) and hw <= delta for hw in widths)

    def status(self, recorded: str, judged_closed: bool, delta: float, sampled: bool = True) -> str:
        """The status a reader is told, from the one the request loop `recorded` (`lifecycle.chunk_status`,
        written at its last step, `judged_closed` if that step found the chunk closed): never
        ``converged`` while a populated metric's interval is undefined or wider than delta (the loop may
        not have run since the population grew or the chunk closed), nor for a closed chunk the loop
        has not judged closed (its sample may still lack the answers of the latest arrivals); a closed
        chunk the loop no longer samples is ``stopped`` unless finished (`lifecycle.final_status`)."""
        from .lifecycle import final_status

        status = recorded
        if status == "converged" and ((self.closed and not judged_closed) or not self.narrow(delta)):
            status = "open"
        return final_status(status, self.closed, sampled)

    def _active(self, metric: str | None) -> Calibrated | None:
        found = self.calibration.get(metric) if metric is not None else None
        return found if found is not None and found.active else None


def chunk_report(columns: StrataColumns, metrics, confidence: float, closed: bool,
                 calibration: dict[str, Calibrated] | None = None, negatives_complete: bool | None = None,
                 complete: bool = True) -> ChunkReport:
    """The report of a chunk's strata `columns` for the enabled `metrics`.

    `closed`: the intervals carry the finite population correction of the chunk's final size (an
    open chunk's population still grows: none).  `calibration`: per metric, the difference
    estimator's `Calibrated` (computed with the same correction); its interval replaces the plain
    one where it is active.  `negatives_complete` False: the metrics that need the predicted
    negatives are undefined; not `complete`: every metric is.  `columns` may carry a leading axis
    of rows (``N``, ``n``, ``h`` of shape (rows, strata), ``positive`` (strata,)): the intervals are
    then per row (`stats.confusion.metric_interval` is), a metric is populated where it is in every
    row (what `simulate --stream --chunks` reads many windows at once with)."""
    metrics = tuple(metrics)
    N, n, h, positive = columns.N, columns.n, columns.h, columns.positive
    calibration = dict(calibration or {})
    active = {m: c.interval for m, c in calibration.items() if c.active}
    intervals: dict[str, Interval | None] = {
        m: active.get(m) or confusion.metric_interval(m, N, n, h, positive, confidence, fpc=closed) for m in metrics}
    if negatives_complete is False or not complete:
        intervals.update({m: None for m in intervals if needs_negatives([m]) or not complete})
    if not complete:
        precision = None
    elif "precision" in intervals:
        precision = intervals["precision"]
    elif "precision" in active:
        precision = active["precision"]
    else:  # the top level describes precision where it is not enabled too: its predicted positives alone
        pos = positive.astype(bool)
        precision = confusion.metric_interval("precision", N[pos], n[pos], h[pos], positive[pos], confidence,
                                              fpc=closed)
    populated = tuple(m for m in metrics if np.all(confusion.population(m, N, positive) > 0))
    return ChunkReport(intervals, precision, populated, bool(closed), calibration)


def _halfwidth(iv: Interval | None) -> float:
    if iv is None or not (np.isfinite(iv.lower) and np.isfinite(iv.upper)):
        return np.nan
    return float((iv.upper - iv.lower) / 2)
