"""The figures of `simulate --stream --chunks` (`chunk_readings.Readings` of every run): coverage and
bias of the window and of the last closed chunk, the window's half-width against a chunk's, and the
default precision SLO alert emulated on the readings.

Coverage and bias are pooled over every reading that shows an interval, their standard errors
clustered by run (`trace._clustered`: a run's readings are correlated), and coverage is also taken
at each reading time over the runs (from the first time every run's series shows one).

The alert is the chart's default (`ALERT_WINDOW`, `ALERT_FOR_SECONDS`: helm/stratameter/values.yaml,
``prometheusRule.precisionSLO``): ``upper bound of the window's interval < SLO``, firing once that
has held at every evaluation for the ``for:`` (Prometheus: from the first evaluation that found it
true, the alert is pending, and it fires at the first evaluation at least ``for`` later), evaluated
at the readings; a series with no interval has no sample, so the expression is false there.  The
chunk-level alert (``window: ""``, the reported chunk's upper bound) is emulated beside it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .chunk_readings import Series
from .trace import Share, _clustered

#: The window the default precision SLO alert reads and its ``for:`` (helm/stratameter/values.yaml).
ALERT_WINDOW = "1d"
ALERT_FOR_SECONDS = 15 * 60
#: The bar a reading time's coverage is held to (issue 49).
COVERAGE_BAR = 0.93


@dataclass
class SeriesSummary:
    """A series' readings: pooled coverage and bias (estimate - truth) with clustered s.e.; the
    lowest coverage of a reading time (over the runs), when it was (hours from the stream's start)
    and how many of the `times` reading times fell under `COVERAGE_BAR`; the mean half-width; the
    lowest coverage of a reading time in each hour of the stream (None before every run shows)."""

    readings: int
    coverage: Share
    bias: Share
    min_coverage: float | None
    min_at_hours: float | None
    times_below: int
    times: int
    halfwidth: float | None
    min_by_hour: list


def summarise_series(s: Series, seconds: np.ndarray) -> SeriesSummary:
    shown = s.shown
    covered = s.covered
    cover, bias = _clustered(covered, shown), _clustered(s.estimate - s.truth, shown)
    every_run = np.flatnonzero(shown.all(axis=0))
    per_time = covered[:, every_run].mean(axis=0) if every_run.size else np.empty(0)
    worst = int(np.argmin(per_time)) if per_time.size else None
    hw = float(np.mean(s.halfwidth[shown])) if shown.any() else None
    hour = (seconds[every_run] - 1e-6) // 3600
    by_hour = [float(per_time[hour == k].min()) if np.any(hour == k) else None
               for k in range(int(np.ceil(seconds[-1] / 3600)))]
    return SeriesSummary(int(shown.sum()), cover, bias, None if worst is None else float(per_time[worst]),
                         None if worst is None else float(seconds[every_run[worst]] / 3600.0),
                         int(np.sum(per_time < COVERAGE_BAR)), int(per_time.size), hw, by_hour)


def firing(condition: np.ndarray, for_readings: int) -> np.ndarray:
    """(runs, readings): the alert fires where `condition` has been true at this reading and the
    `for_readings` before it (Prometheus ``for:`` of ``for_readings`` evaluation intervals)."""
    idx = np.arange(condition.shape[1])
    last_false = np.maximum.accumulate(np.where(condition, -1, idx), axis=1)
    return idx - last_false > for_readings


@dataclass
class AlertSummary:
    """One alert at one SLO: the hours from the drop until it fires (per run: the first reading at or
    after the drop at which it fires; the share of runs where it fired before the stream ended, and
    among them the mean and quantiles), and its onsets before the drop per day observed (the days
    from the first reading that shows the series to the drop, or the stream's end; ``full_window_``:
    those of them where the window pools all its chunks)."""

    alert: str  # "window" or "chunk"
    slo: float
    slo_offset: float  # the classifier's precision before the drop minus the SLO
    fired: float | None
    hours_mean: float | None
    hours_p10: float | None
    hours_median: float | None
    hours_p90: float | None
    false_alarms_per_day: Share
    false_alarms: int
    days: float
    full_window_false_alarms_per_day: Share
    full_window_false_alarms: int
    full_window_days: float


def summarise_alert(alert: str, upper: np.ndarray, shown: np.ndarray, full: np.ndarray, seconds: np.ndarray,
                    slo: float, slo_offset: float, every: float, drop_seconds: float | None) -> AlertSummary:
    """`alert` on the readings `upper` (NaN: none) at `slo`; `shown`: the readings the series shows,
    `full`: those where the window pools all its chunks."""
    fires = firing(np.nan_to_num(upper, nan=np.inf) < slo, int(round(ALERT_FOR_SECONDS / every)))
    onset = fires & ~np.pad(fires, ((0, 0), (1, 0)))[:, :-1]
    before = seconds < (np.inf if drop_seconds is None else drop_seconds)
    observed = (np.cumsum(shown, axis=1) > 0) & before
    false, count, days = _per_day(onset, observed, every)
    false_full, count_full, days_full = _per_day(onset, observed & full, every)
    hours = [None] * 5
    if drop_seconds is not None:
        after = fires & ~before
        first = np.where(after.any(axis=1), np.argmax(after, axis=1), -1)
        h = (seconds[first[first >= 0]] - drop_seconds) / 3600.0
        hours = [float(np.mean(first >= 0))] + ([float(np.mean(h)), *map(float, np.quantile(h, [0.1, 0.5, 0.9]))]
                                                 if h.size else [None] * 4)
    return AlertSummary(alert, slo, slo_offset, *hours, false, count, days, false_full, count_full, days_full)


def _per_day(onset: np.ndarray, observed: np.ndarray, every: float) -> tuple[Share, int, float]:
    """Onsets per day over the `observed` readings (s.e. clustered by run), their count, the days."""
    rate = _clustered(onset, observed)
    per_day = 86400.0 / every
    share = Share(None if rate.mean is None else rate.mean * per_day,
                  None if rate.se is None else rate.se * per_day, rate.readings)
    return share, int((onset & observed).sum()), float(observed.sum() * every / 86400.0)


def halfwidth_ratio(window: Series, last: Series, pooled: np.ndarray, length: int) -> float | None:
    """The window's mean half-width over the last closed chunk's, at the readings where the window
    pools its full `length` chunks and both show an interval."""
    use = (pooled == length) & window.shown & last.shown
    if not use.any():
        return None
    return float(np.mean(window.halfwidth[use]) / np.mean(last.halfwidth[use]))


