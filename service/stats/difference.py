"""The score inside the strata: the difference (model-assisted) estimator of precision.

Inside a stratum the score still predicts the label; the stratified mean ignores it.  The
difference estimator (Sarndal, Swensson & Wretman 1992, "Model Assisted Survey Sampling",
Sec. 6.3; prediction-powered inference, Angelopoulos et al. 2023, is the same estimator)
adds a calibrated prediction ``g(s)`` of the label, known for every item of the stratum,
and estimates only the residual from the labels:

    p_k = G_k + mean_{i in S_k} (y_i - g(s_i)),    G_k = mean of g over the N_k items.

It is unbiased for any ``g`` fixed before the labels it is applied to are seen, and its
variance is the residuals' spread instead of the labels': smaller wherever ``g`` tracks the
label inside the stratum.  Here ``g`` is a two-parameter Platt calibration
(``g(s) = expit(a + b x(s))``, Platt 1999, with ``x`` the score's logit for probabilities,
the score itself for margins and logits) learnt from the labels themselves, **cross-fitted**
over two folds (Zrnic & Candes 2024, "Cross-prediction-powered inference", PNAS 121): a
label in fold f is predicted by the calibration fitted on the other fold only, so no
calibration ever sees the label it predicts.  With pseudo-outcomes

    z_i = y_i - g_{-f_i}(s_i) + G_{k, -f_i}

the estimator is the stratified mean of ``z`` and its variance the stratified variance of
``z``, so everything the plain estimator does (the half-label guard, the adaptive-bias
correction, the Wilson interval with the design-effect ``n_eff`` at its centre,
`estimator.wilson_interval`) carries over by moments: `difference_interval` with ``z = y``
(no calibration) *is* `estimator.wilson_interval`.  The half-label guard adds, as there,
half a label of each class at the stratum's mean prediction (``z`` = 1 and 0).

Pure numpy; no I/O.  The population means ``G_k`` come from the score histogram the service
keeps (`StratumGrid`, buckets split at the cuts: `tests/unit/test_difference.py` measures the bias).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import expit, logit

from .calibration import resolve_kind
from .confusion import METRICS, moments_ratio_interval, population
from .estimator import (Interval, _as_counts, shifts_of_means, undefined_interval, weights, wilson_design_effect,
                        z_value)
from .moments import StratumMoments
from .sketch import ScoreHistogram, bin_edges_score

#: Labels a classifier's chunk needs before the calibration is used (below: the plain estimator).
CALIBRATION_MIN_LABELS = 100
#: The calibration is used only while its cross-fitted variance is at most this share of the
#: plain estimator's: whichever is smaller (docs/decisions/calibration-switch.md).
CALIBRATION_MARGIN = 1.0
#: Ridge of the Platt fit toward the identity calibration (a = 0, b = 1), in labels: keeps the
#: fit finite when the labels are separable; small, as the identity is far from a steep model's
#: calibration (docs/decisions/calibration-switch.md).
PLATT_RIDGE = 0.1
#: Probabilities are clipped this far from 0 and 1 before their logit.
_EPS = 1e-6


def feature(scores, kind: str) -> np.ndarray:
    """The calibration's input ``x(s)``: the logit of a probability, a margin or logit as is
    (`calibration.to_probability` maps ``x`` back with the identity calibration)."""
    s = np.asarray(scores, dtype=float)
    if kind == "probability":
        return logit(np.clip(s, _EPS, 1.0 - _EPS))
    if kind == "logit":
        return s
    raise ValueError(f"score kind must be 'probability' or 'logit', got {kind!r}")


@dataclass(frozen=True)
class Platt:
    """``g(x) = expit(intercept + slope * x)``."""

    intercept: float = 0.0
    slope: float = 1.0

    def __call__(self, x) -> np.ndarray:
        return expit(self.intercept + self.slope * np.asarray(x, dtype=float))


def fit_platt(x, y, ridge: float = PLATT_RIDGE, iterations: int = 100) -> Platt:
    """Maximum penalised likelihood logistic regression of ``y`` on ``x`` (Platt 1999), the
    penalty ``ridge/2 ((a - 0)^2 + (b - 1)^2)`` pulling toward the identity calibration.

    Newton's method with step halving (the penalised log-likelihood is strictly concave, and a
    step is halved until it rises: plain Newton diverges on labels of one class, or separable
    ones, at scores far from 0), its 2x2 system solved in closed form (the request loop fits
    three calibrations a step).  No labels: identity."""
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.size == 0:
        return Platt()
    sum_y, sum_xy, xx = float(y.sum()), float(x @ y), x * x
    total = np.add.reduce  # ndarray.sum's reduction, without its method's overhead

    def objective(a: float, b: float) -> tuple[float, np.ndarray]:
        eta = a + b * x
        value = float(sum_y * a + sum_xy * b - total(np.logaddexp(0.0, eta))) - ridge / 2 * (a * a + (b - 1.0) ** 2)
        return value, eta

    a, b = 0.0, 1.0
    value, eta = objective(a, b)
    for _ in range(iterations):
        p = expit(eta)  # eta = a + b x, as the objective computed it at (a, b)
        w = p * (1.0 - p)
        grad_a = sum_y - float(total(p)) - ridge * a
        grad_b = sum_xy - float(x @ p) - ridge * (b - 1.0)
        h_aa, h_ab, h_bb = float(total(w)) + ridge, float(w @ x), float(w @ xx) + ridge
        det = h_aa * h_bb - h_ab * h_ab
        step_a = (h_bb * grad_a - h_ab * grad_b) / det
        step_b = (h_aa * grad_b - h_ab * grad_a) / det
        for _ in range(60):
            moved, moved_eta = objective(a + step_a, b + step_b)
            if moved >= value:
                break
            step_a, step_b = step_a / 2.0, step_b / 2.0
        else:
            break  # no step rises: at the optimum to rounding
        a, b, value, eta = a + step_a, b + step_b, moved, moved_eta
        if max(abs(step_a), abs(step_b)) < 1e-10:
            break
    return Platt(a, b)


@dataclass(frozen=True)
class StratumGrid:
    """The population of a chunk as the histogram sees it: ``counts[k, b]`` items of stratum k
    in bucket b, at the feature ``x[k, b]`` of that part's midpoint (shape (K, buckets))."""

    x: np.ndarray
    counts: np.ndarray

    @classmethod
    def from_histogram(cls, hist: ScoreHistogram, cuts, kind: str = "auto") -> "StratumGrid":
        """Each bucket (clipped to the observed range, as `calibration.stratum_mean_probability`)
        split at the strata cuts, its count shared in proportion to the length of each part (the
        histogram's own assumption of scores spread evenly inside a bucket, as `strata.boundaries`
        interpolates), each part at its midpoint: a bucket across a cut is not given whole to
        one stratum (measured on `steep`: stratum means within 3.4e-4 of the exact ones, 1.7e-3
        with whole buckets, `tests/unit/test_difference.py`)."""
        concrete = resolve_kind(kind, hist.min, hist.max)
        edges = bin_edges_score()
        used = np.flatnonzero(hist.counts)
        lo = np.clip(edges[:-1][used], hist.min, hist.max)
        hi = np.clip(edges[1:][used], hist.min, hist.max)
        bounds = np.concatenate([[-np.inf], np.asarray(cuts, dtype=float), [np.inf]])
        part_lo = np.maximum(lo[None, :], bounds[:-1, None])
        part_hi = np.minimum(hi[None, :], bounds[1:, None])
        width = hi - lo
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(width > 0, np.clip(part_hi - part_lo, 0.0, None) / np.where(width > 0, width, 1.0), 0.0)
        # a bucket of zero width (every score in it equal) belongs to the stratum of that score
        point = np.searchsorted(np.asarray(cuts, dtype=float), lo, side="right")
        share[:, width == 0] = 0.0
        share[point[width == 0], np.flatnonzero(width == 0)] = 1.0
        mid = np.where(share > 0, (part_lo + part_hi) / 2.0, (lo + hi)[None, :] / 2.0)
        return cls(feature(mid, concrete), share * hist.counts[used][None, :])

    @classmethod
    def stack(cls, grids: list["StratumGrid"]) -> "StratumGrid":
        """The strata of several grids in order, one grid (both sides of the threshold: the
        positives' strata, then the negatives'); shorter rows padded with empty buckets."""
        width = max(g.x.shape[1] for g in grids)
        pad = lambda a: np.pad(a, ((0, 0), (0, width - a.shape[1])))  # noqa: E731
        return cls(np.vstack([pad(g.x) for g in grids]), np.vstack([pad(g.counts) for g in grids]))

    def means(self, g: Platt) -> np.ndarray:
        """``G_k``: the mean prediction of `g` over each stratum's items (0 for an empty one)."""
        mass = self.counts.sum(axis=1)
        total = np.sum(self.counts * g(self.x), axis=1)
        return np.where(mass > 0, total / np.where(mass > 0, mass, 1.0), 0.0)


@dataclass(frozen=True)
class Labelled:
    """A chunk's labelled items: stratum, calibration feature ``x``, label (1 = truly
    positive) and cross-fitting fold (0 or 1) of each."""

    stratum: np.ndarray
    x: np.ndarray
    y: np.ndarray
    fold: np.ndarray

    def __post_init__(self):
        for name in ("stratum", "x", "y", "fold"):
            object.__setattr__(self, name, np.asarray(getattr(self, name)))
        if not self.stratum.shape == self.x.shape == self.y.shape == self.fold.shape:
            raise ValueError("stratum, x, y and fold must have one entry per labelled item")
        if self.fold.size and not _zero_or_one(self.fold):
            raise ValueError("fold must be 0 or 1")
        if self.y.size and not _zero_or_one(self.y):
            raise ValueError("labels must be 0 or 1")


def _zero_or_one(a: np.ndarray) -> bool:
    """Every entry is 0 or 1 (`np.isin` with (0, 1); for numbers, two comparisons: the request loop
    builds a chunk's labelled items a few times a step)."""
    if a.dtype.kind in "biuf":
        return bool(((a == 0) | (a == 1)).all())
    return bool(np.isin(a, (0, 1)).all())


def cross_fitted(items: Labelled, ridge: float = PLATT_RIDGE) -> tuple[Platt, Platt]:
    """``(g_{-0}, g_{-1})``: the calibration for fold f, fitted on the labels of the other fold."""
    return tuple(fit_platt(items.x[items.fold != f], items.y[items.fold != f], ridge) for f in (0, 1))


def pseudo_outcomes(items: Labelled, grid: StratumGrid, calibrations: tuple[Platt, Platt]) -> np.ndarray:
    """``z_i = y_i - g_{-f_i}(x_i) + G_{k_i, -f_i}`` (module docstring)."""
    z = items.y.astype(float).copy()
    for f, g in enumerate(calibrations):
        mine = items.fold == f
        z[mine] += grid.means(g)[items.stratum[mine]] - g(items.x[mine])
    return z


def difference_interval(N, stratum, z, confidence: float = 0.95, fpc: bool = True) -> Interval:
    """`estimator.wilson_interval` for the stratified mean of pseudo-outcomes `z` (one per label,
    in `stratum`): the same half-label guard (half a label of each class, ``z`` = 1 and 0, in
    each stratum's spread), adaptive-bias correction, stopping margin, design-effect ``n_eff``
    and reported estimate (`estimator.Interval`).  With ``z = y`` it is `wilson_interval` on the counts."""
    N = np.asarray(N, dtype=float)
    return moments_interval(N, StratumMoments.of_outcomes(N.shape[-1], stratum, z), confidence, fpc)


def moments_interval(N, m: StratumMoments, confidence: float = 0.95, fpc: bool = True) -> Interval:
    """`difference_interval` from the outcomes' moments `m` (`StratumMoments.of_outcomes`)."""
    N = np.asarray(N, dtype=float)
    _as_counts(N, m.n, np.zeros(N.shape[-1]))
    W = weights(N)
    var = np.sum(np.where(W > 0, W**2 * m.variances(N, fpc), 0.0))
    missing = ((m.n == 0) & (W > 0)).any()
    pbar = np.clip(m.guarded_mean, 1e-9, 1.0 - 1e-9)
    at_stop, now = (np.asarray(np.nan if missing else np.sum(W * np.clip(m.mean + shift, 0.0, 1.0)), dtype=float)
                    for shift in shifts_of_means(N, m.n, pbar, m.spread, W**2, var, fpc))
    return wilson_design_effect(at_stop, var, m.n.sum(), z_value(confidence), now)


def metric_interval(metric: str, N, positive, stratum, z, y, confidence: float = 0.95, fpc: bool = True) -> Interval:
    """The interval of `metric` (`confusion.METRICS`) from outcomes `z` of the labelled items (one
    each, in `stratum`; `y` their labels), strata of predicted positives where `positive`: the
    difference estimator with pseudo-outcomes, `confusion.metric_interval` with ``z = y``.

    Every metric is a function of the stratum proportions ``p_k``, each estimated by its stratum's
    mean of ``z`` (module docstring), so each keeps the plain estimator's interval with the
    pseudo-outcomes' moments in place of the labels' (Sarndal et al. 1992, Sec. 6.3; the
    linearisation of a function of difference estimators, Sec. 6.6 and 5.5):

    * precision: `difference_interval` over the positive strata;
    * accuracy: `difference_interval` of "the prediction was right", ``z`` on positive strata and
      ``1 - z`` on negative ones (the difference estimator of ``1 - y`` with prediction ``1 - g``);
    * recall, F1: `confusion.moments_ratio_interval`, the linearisation variance of the
      pseudo-outcomes' stratum means."""
    N = np.asarray(N, dtype=float)
    positive = np.asarray(positive, dtype=bool)
    stratum = np.asarray(stratum, dtype=int)
    z = np.asarray(z, dtype=float)
    if metric in METRICS and population(metric, N, positive) <= 0:  # precision with no predicted positive
        return undefined_interval(N.shape[:-1])
    if metric == "precision":
        renumber = np.cumsum(positive) - 1
        mine = positive[stratum]
        return difference_interval(N[positive], renumber[stratum[mine]], z[mine], confidence, fpc)
    if metric == "accuracy":
        return difference_interval(N, stratum, np.where(positive[stratum], z, 1.0 - z), confidence, fpc)
    if metric in ("recall", "f1"):
        k = N.size
        events = np.bincount(stratum, weights=np.asarray(y, dtype=float), minlength=k)
        return moments_ratio_interval(metric, N, StratumMoments.of_outcomes(k, stratum, z), events, positive,
                                      confidence, fpc)
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")


@dataclass(frozen=True)
class Calibrated:
    """The precision interval a chunk reports and how it was made: the difference estimator's
    when the calibration is `active`, else the plain estimator's; ``calibration`` is the Platt
    fit on every label (what `/v1/classifiers/{id}` shows; None where the caller did not ask for it),
    ``labels_used`` its labels."""

    interval: Interval
    plain: Interval
    difference: Interval | None
    calibration: Platt | None
    labels_used: int
    active: bool
    # per stratum: the residuals' sd over the labels' (guarded); derived from the above, not compared
    spread_ratio: np.ndarray | None = field(default=None, compare=False)

    @property
    def variance_ratio(self) -> float:
        """The reported interval's variance over the plain one's (1 unless `active`): the share of
        the plain estimator's labels the reported one needs for the same width."""
        if not self.active:
            return 1.0
        return float(self.difference.stderr ** 2 / self.plain.stderr ** 2)

    @property
    def allocation_scale(self) -> np.ndarray | None:
        """Per stratum, what Neyman's shares are multiplied by so that the rounds allocate on
        the residual spread (``N_k S_k(z)``, `allocation.neyman_shares` ``scale``); None unless
        `active`."""
        return self.spread_ratio if self.active else None


def calibrated_interval(N, items: Labelled, grid: StratumGrid, confidence: float = 0.95, fpc: bool = True,
                        min_labels: int = CALIBRATION_MIN_LABELS, margin: float = CALIBRATION_MARGIN, *,
                        shown: bool = True) -> Calibrated:
    """Precision's `calibrated_metrics` over strata of predicted positives only."""
    return calibrated_metrics(N, np.ones(np.asarray(N).shape[-1], dtype=bool), items, grid, ("precision",),
                              confidence, fpc, min_labels, margin, shown=shown)["precision"]


def calibrated_metrics(N, positive, items: Labelled, grid: StratumGrid, metrics, confidence: float = 0.95,
                       fpc: bool = True, min_labels: int = CALIBRATION_MIN_LABELS,
                       margin: float = CALIBRATION_MARGIN, *, shown: bool = True) -> dict[str, Calibrated]:
    """Per enabled metric, the switch (module docstring): below `min_labels` labels, or with a fold
    empty, the plain estimator (`metric_interval` with ``z = y``: `confusion.metric_interval` to
    rounding, `tests/unit/test_difference.py`); above, the difference
    estimator (`metric_interval`) while its cross-fitted variance is at most `margin` times the
    plain one's (both guarded, at the same labels) and its interval is no wider.  The second
    condition matters near 0 and 1 only: where every label agrees the plain interval is Wilson's
    on all the labels (`estimator.wilson_design_effect`), narrower than a smaller variance gives
    the pseudo-outcomes' estimate just inside; without it the design took more labels with the
    calibration (fraud-rare accuracy at delta 0.02: +3.3 % labels, 2000 paired runs; near-perfect
    precision saved 1.6 % instead of 3.8 %, 400 paired runs; the other populations unchanged).  One calibration for every stratum, both sides
    of the threshold (`positive`): it maps the score to the chance the item is truly positive,
    whatever the decision, and the grid holds every stratum's items.
    Without `shown`, no calibration is fitted on every label (``Calibrated.calibration`` None): the
    switch does not use it, and the simulations, which run the switch thousands of times, never
    show it."""
    N = np.asarray(N, dtype=float)
    positive = np.asarray(positive, dtype=bool)
    k = N.shape[-1]
    labels_moments = StratumMoments.of_outcomes(k, items.stratum, items.y)

    def interval(m: str, z, moments: StratumMoments) -> Interval:  # `metric_interval`, from `moments` where it can
        if m == "precision" and positive.all() and population(m, N, positive) > 0:
            return moments_interval(N, moments, confidence, fpc)  # precision over every stratum: z's own moments
        return metric_interval(m, N, positive, items.stratum, z, items.y, confidence, fpc)

    plain = {m: interval(m, items.y, labels_moments) for m in metrics}
    everything = fit_platt(items.x, items.y) if shown else None
    labels = int(items.y.size)
    if labels < min_labels or not (items.fold == 0).any() or not (items.fold == 1).any():
        return {m: Calibrated(plain[m], plain[m], None, everything, labels, False) for m in metrics}
    z = pseudo_outcomes(items, grid, cross_fitted(items))
    pseudo_moments = StratumMoments.of_outcomes(k, items.stratum, z)
    residual, spread = pseudo_moments.guarded_spread, labels_moments.guarded_spread
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(spread > 0, np.sqrt(residual / np.where(spread > 0, spread, 1.0)), 1.0)
    out = {}
    for m in metrics:
        diff = interval(m, z, pseudo_moments)
        # a plain variance of 0 (recall with no predicted positive: TP is 0 for sure) leaves nothing to reduce
        active = bool(np.isfinite(diff.stderr) and plain[m].stderr > 0
                      and diff.stderr**2 <= margin * plain[m].stderr**2 and diff.halfwidth <= plain[m].halfwidth)
        out[m] = Calibrated(diff if active else plain[m], plain[m], diff, everything, labels, active, ratio)
    return out
