"""The gauge trace of `stratameter simulate --stream --trace`: what the service's estimate gauge
shows every `SCRAPE_SECONDS` of a chunk (a Prometheus scrape), beside what it refers to.

At a reading at time ``t`` after the chunk's start the service computes the chunk's interval from
its counts at ``t`` (`api.views.chunk_view`): `streams.chunk_interval` (the finite population
correction only once the chunk has closed; the difference estimator's interval where
``calibration_min_labels`` is set and its switch keeps it), null while a non-empty stratum has
fewer than two labels; the estimate is `Interval.estimate`, the reading at any moment.  An open
chunk's estimate refers to the items arrived so far: the truth of a reading is the metric of the
arrived items (precision: true positives among them over their count).

`GaugeRecorder` takes the readings inside `stream.run_stream` (every run at once, one interval per
reading), `GaugeTrace` holds them, `summarise` gives a cell's bias and coverage: pooled over every
reading of every run (standard errors clustered by run: a run's readings are correlated) and at
given minutes (one reading per run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..chunks import lifecycle
from ..stats import streams
from ..stats.confusion import metric_interval, value

#: Seconds between two readings of the gauge (a Prometheus scrape interval).
SCRAPE_SECONDS = 30.0
#: Minutes after the chunk's start reported on their own.
MINUTES = (5, 10, 30)


@dataclass
class GaugeTrace:
    """Readings of the gauge every `every` seconds over each run's chunk, from its start until the run
    stops (a reading at the stop's own time included); after a run's stop ``taken`` is False and
    the values NaN.  Arrays are (runs, readings) float32 except ``seconds``/``minute`` (readings,),
    the same for every run."""

    every: float
    seconds: np.ndarray  # (readings,) time of each reading after the chunk's start: every, 2 every, ...
    estimate: np.ndarray  # the gauge's estimate; NaN while it shows none
    lower: np.ndarray
    upper: np.ndarray
    truth: np.ndarray  # the metric of the items arrived by then (NaN before the first one)
    taken: np.ndarray  # bool: the run was still running (the reading exists)

    @property
    def minute(self) -> np.ndarray:
        return self.seconds / 60.0

    @classmethod
    def concat(cls, parts: list["GaugeTrace"]) -> "GaugeTrace":
        """The runs of several traces (the same `every`), the shorter ones padded with no reading."""
        width = max(p.seconds.size for p in parts)
        seconds = max(parts, key=lambda p: p.seconds.size).seconds

        def pad(x, fill):
            return np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=fill)

        return cls(parts[0].every, seconds, *(np.concatenate([pad(getattr(p, f), np.nan) for p in parts])
                                              for f in ("estimate", "lower", "upper", "truth")),
                   np.concatenate([pad(p.taken, False) for p in parts]))

    def column(self, minute: float) -> int | None:
        """The reading at exactly `minute` after the chunk's start, if there is one."""
        hit = np.flatnonzero(np.isclose(self.seconds, 60.0 * minute, rtol=0.0, atol=1e-6))
        return int(hit[0]) if hit.size else None


class GaugeRecorder:
    """Takes `GaugeTrace` readings inside `run_stream`'s loop.

    The loop calls `before(now, ...)` at the top of a step (readings strictly before ``now``: the
    state is still the one of the last step run, and nothing changed in the steps it skipped) and
    `at(now, ...)` once the step's answers and arrivals are counted (a reading at ``now``)."""

    def __init__(self, runs: int, K: int, every: float, end: float, lateness: float, confidence: float,
                 target=None, metric: str = "precision", positive=None) -> None:
        if not every > 0:
            raise ValueError("the gauge's scrape interval must be > 0 seconds")
        self.runs, self.every, self.end, self.lateness = runs, float(every), float(end), float(lateness)
        self.confidence, self.target, self.metric = confidence, target, metric
        self.positive = np.ones(K, dtype=bool) if positive is None else np.asarray(positive, dtype=bool)
        self.G = np.zeros((runs, K))  # arrived true positives (label 1), per stratum
        self.columns: list[tuple[np.ndarray, ...]] = []
        self.times: list[float] = []

    def arrived(self, flat: np.ndarray, y: np.ndarray) -> None:
        """Items arrived, at ``flat = run * K + stratum`` with labels `y`."""
        self.G += np.bincount(flat, weights=y, minlength=self.G.size).reshape(self.G.shape)

    def _next(self) -> float:
        return (len(self.times) + 1) * self.every

    def before(self, now: float, active, N, n, h, calibrate=None) -> None:
        """Readings strictly before `now`, on the current counts (the same for all of them but the
        finite population correction, which starts at the close)."""
        cache: dict[bool, tuple] = {}
        while self._next() < now - 1e-9:
            t = self._next()
            closed = bool(lifecycle.is_closed(t, self.end, self.lateness))
            if closed not in cache:
                cache[closed] = self._reading(t, closed, active, N, n, h, calibrate)
            self.times.append(t)
            self.columns.append(cache[closed])

    def at(self, now: float, active, N, n, h, calibrate=None) -> None:
        """A reading at `now`, if one is due then."""
        t = self._next()
        if abs(t - now) <= 1e-9:
            self.times.append(t)
            self.columns.append(self._reading(t, bool(lifecycle.is_closed(t, self.end, self.lateness)), active,
                                              N, n, h, calibrate))

    def _reading(self, t: float, closed: bool, active, N, n, h, calibrate) -> tuple[np.ndarray, ...]:
        R = self.runs
        est, lo, hi, truth = (np.full(R, np.nan, dtype=np.float32) for _ in range(4))
        a = np.flatnonzero(active)
        if a.size:
            Na, na, ha = N[a], n[a], h[a]
            if self.target is None:
                iv = streams.chunk_interval(Na, na, ha, self.confidence, closed, None)
            else:  # the gauge of the study's metric
                iv = metric_interval(self.metric, Na, na, ha, self.positive, self.confidence, fpc=closed)
            e, l, u = (np.array(x, dtype=float) for x in (iv.estimate, iv.lower, iv.upper))
            if calibrate is not None:  # the difference estimator's interval where its switch keeps it
                for i, iv_i in calibrate(t, closed, a):
                    e[i], l[i], u[i] = iv_i.estimate, iv_i.lower, iv_i.upper
            ok = np.isfinite(l) & np.isfinite(u)
            est[a] = np.where(ok, e, np.nan)
            lo[a], hi[a] = np.where(ok, l, np.nan), np.where(ok, u, np.nan)
            with np.errstate(divide="ignore", invalid="ignore"):
                truth[a] = value(self.metric, Na, self.G[a] / np.where(Na > 0, Na, 1.0), self.positive)
        taken = np.zeros(R, dtype=bool)
        taken[a] = True
        return est, lo, hi, truth, taken

    def result(self) -> GaugeTrace:
        R = self.runs
        if not self.columns:
            empty = np.zeros((R, 0), dtype=np.float32)
            return GaugeTrace(self.every, np.zeros(0), empty, empty.copy(), empty.copy(), empty.copy(),
                              np.zeros((R, 0), dtype=bool))
        est, lo, hi, truth, taken = (np.stack(x, axis=1) for x in zip(*self.columns))
        return GaugeTrace(self.every, np.array(self.times), est, lo, hi, truth, taken)


@dataclass
class Share:
    """A mean over readings with its standard error and how many readings it is over."""

    mean: float | None
    se: float | None
    readings: int


@dataclass
class TraceSummary:
    """A cell's readings: bias of the estimate (estimate - truth so far) and coverage of the
    interval (lower <= truth so far <= upper), over the readings that show an interval;
    ``readings`` taken in all, ``no_interval`` of them null."""

    readings: int
    no_interval: int
    bias: Share
    coverage: Share
    at_minute: dict  # minute -> {"bias": Share, "coverage": Share, "no_interval": int}


def _clustered(values: np.ndarray, use: np.ndarray) -> Share:
    """Mean of `values` over the cells `use` of (runs, readings), its s.e. clustered by run (the ratio
    estimator's: ``sqrt(R/(R-1) sum_r (S_r - mean n_r)^2) / sum n``)."""
    v = np.where(use, values.astype(float), 0.0)
    S, cnt = v.sum(axis=1), use.sum(axis=1).astype(float)
    total = float(cnt.sum())
    if total == 0:
        return Share(None, None, 0)
    mean = float(S.sum() / total)
    runs = int((cnt > 0).sum())
    se = math.sqrt(runs / (runs - 1) * float(np.sum((S - mean * cnt) ** 2))) / total if runs > 1 else None
    return Share(mean, se, int(total))


def summarise(g: GaugeTrace, minutes=MINUTES) -> TraceSummary:
    """Bias and coverage pooled over every reading, and at each of `minutes` (where a reading falls)."""
    shown = g.taken & np.isfinite(g.estimate) & np.isfinite(g.truth)
    covered = (g.lower <= g.truth) & (g.truth <= g.upper)

    def part(cols) -> tuple[Share, Share, int, int]:
        use = shown[:, cols]
        return (_clustered((g.estimate - g.truth)[:, cols], use), _clustered(covered[:, cols], use),
                int(g.taken[:, cols].sum()), int((g.taken[:, cols] & ~use).sum()))

    bias, cover, taken, null = part(slice(None))
    at = {}
    for m in minutes:
        j = g.column(m)
        if j is None:
            continue
        b, c, _, nul = part(slice(j, j + 1))
        at[m] = {"bias": b, "coverage": c, "no_interval": nul}
    return TraceSummary(taken, null, bias, cover, at)
