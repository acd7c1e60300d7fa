"""Precision, recall, F1 and accuracy from one stratified sample of the whole stream.

Strata now cover both sides of the decision threshold: ``positive[k]`` is
True for a stratum of predicted positives and False for one of predicted
negatives.  In every stratum ``h_k`` of ``n_k`` labels say "truly positive",
so with ``p_k`` the stratum's share of true positives the confusion totals are

    TP = sum_{k pos} N_k p_k        FP = sum_{k pos} N_k (1 - p_k)
    FN = sum_{k neg} N_k p_k        TN = sum_{k neg} N_k (1 - p_k)

and every metric is a smooth function ``M(p)`` of the vector of stratum means
(Druck & McCallum 2011, Sec. 4.2: a non-linear target function of a vector of
stratified means):

* precision ``TP / (TP + FP)`` and accuracy ``(TP + TN) / N`` are linear in
  ``p`` (accuracy is the stratified mean of "the prediction was right", i.e.
  ``p_k`` on positive strata and ``1 - p_k`` on negative ones): both use
  today's `estimator.wilson_interval` unchanged;
* recall ``TP / (TP + FN)`` and F1 ``2 TP / (2 TP + FP + FN)`` are ratios,
  estimated by the plug-in ``M(p^)`` (Krewski & Rao 1981) with the
  linearisation (Taylor) variance ``sum_k (dM/dp_k)^2 Var(p^_k)``
  (`linearised_variance`) and the Wilson interval on the design-effect
  effective sample size (`ratio_interval`).

All functions take arrays whose last axis is the stratum axis, as
`estimator` does, so the simulator evaluates thousands of runs in one call.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from .estimator import (
    STOPPING_VARIANCE_MARGIN,
    Interval,
    _as_counts,
    half_label_smoothed,
    shifts_of_means,
    stratum_variances,
    undefined_interval,
    wilson_interval,
    wilson_score,
    z_value,
)
from .moments import StratumMoments

METRICS: tuple[str, ...] = ("precision", "recall", "f1", "accuracy")
#: The adaptive-bias correction of a stratum's proportion is first order in
#: ``1 / (n_k p_k (1 - p_k))``; in a stratum that has seen fewer of its rarer
#: outcome than this (a false-negative stratum with one or two hits) the
#: expansion does not hold and would double the stratum's estimate, so it is
#: not applied there.
SHIFT_MIN_EVENTS = 5
#: How the predicted negatives are stratified by default (docs/concepts/statistics.md "Recall, F1 and accuracy": their
#: false negatives sit near the threshold, which equal-count strata dilute).
DEFAULT_NEGATIVE_STRATIFICATION = "cum_sqrt_prior"
#: Metrics that need labels of predicted negatives.
NEEDS_NEGATIVES: frozenset[str] = frozenset({"recall", "f1", "accuracy"})
#: Ratios of stratified totals (linearised, `moments_ratio_interval`); precision and accuracy are
#: stratified means of the labels.
RATIO_METRICS: frozenset[str] = frozenset({"recall", "f1"})


def parse_metrics(value) -> tuple[str, ...]:
    """Metric names from a comma list or a sequence, in `METRICS` order.

    Raises ValueError naming the unknown entry, or on an empty list.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    names = [str(item).strip().lower() for item in items if str(item).strip()]
    unknown = [name for name in names if name not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; choose from {', '.join(METRICS)}")
    if not names:
        raise ValueError(f"at least one metric is needed; choose from {', '.join(METRICS)}")
    return tuple(m for m in METRICS if m in names)


def needs_negatives(metrics) -> bool:
    """Whether any of `metrics` needs labels of predicted negatives."""
    return any(m in NEEDS_NEGATIVES for m in metrics)


def _totals(N, p, positive) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(TP, FN, N_pos, N)`` from stratum sizes and proportions of true positives."""
    N = np.asarray(N, dtype=float)
    p = np.asarray(p, dtype=float)
    pos = np.asarray(positive, dtype=bool)
    mass = N * p
    tp = np.sum(np.where(pos, mass, 0.0), axis=-1)
    fn = np.sum(np.where(pos, 0.0, mass), axis=-1)
    n_pos = np.sum(np.where(pos, N, 0.0), axis=-1)
    return tp, fn, n_pos, N.sum(axis=-1)


def value(metric: str, N, p, positive) -> np.ndarray:
    """``M(p)``: the metric of stratum proportions `p` (the truth when ``p = G/N``).

    NaN where the metric is undefined (no predicted positive for precision,
    no true positive for recall, nothing at all for F1).
    """
    return value_of_totals(metric, *_totals(N, p, positive))


def value_of_totals(metric: str, tp, fn, n_pos, n_all) -> np.ndarray:
    """`value` from the totals ``(TP, FN, N_pos, N)`` (`_totals`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "precision":
            num, den = tp, n_pos
        elif metric == "recall":
            num, den = tp, tp + fn
        elif metric == "f1":
            num, den = 2.0 * tp, n_pos + tp + fn
        elif metric == "accuracy":
            tn = n_all - n_pos - fn
            num, den = tp + tn, n_all
        else:
            raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def gradient(metric: str, N, p, positive) -> np.ndarray:
    """``dM/dp_k`` per stratum (the linearised variable's weight, Taylor 1st order): ``N_k`` times
    its side's slope (`side_slopes`), 0 for an empty stratum."""
    N = np.asarray(N, dtype=float)
    pos = np.asarray(positive, dtype=bool)
    on_pos, on_neg = side_slopes(metric, *(t[..., None] for t in _totals(N, p, positive)))
    with np.errstate(invalid="ignore"):
        g = N * np.where(pos, on_pos, on_neg)
    return np.where(N > 0, np.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0), 0.0)


def side_slopes(metric: str, tp, fn, n_pos, n_all) -> tuple:
    """``dM/dp_k / N_k`` on the predicted positives' strata and on the predicted negatives', from
    the totals ``(TP, FN, N_pos, N)``:

    * precision ``1 / N_pos`` (positive), 0 (negative);
    * recall ``FN / (TP+FN)^2`` (positive), ``-TP / (TP+FN)^2`` (negative);
    * F1 with ``D = N_pos + TP + FN``: ``2 (N_pos + FN) / D^2`` (positive), ``-2 TP / D^2`` (negative);
    * accuracy ``1 / N`` (positive), ``-1 / N`` (negative).
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        if metric == "precision":
            return 1.0 / n_pos, 0.0
        if metric == "recall":
            den = (tp + fn) ** 2
            return fn / den, -tp / den
        if metric == "f1":
            den = (n_pos + tp + fn) ** 2
            return 2.0 * (n_pos + fn) / den, -2.0 * tp / den
        if metric == "accuracy":
            return 1.0 / n_all, -1.0 / n_all
    raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")


def linearised_variance(metric: str, N, n, h, positive, fpc: bool = True, p_var=None) -> np.ndarray:
    """Taylor (linearisation) variance ``sum_k g_k^2 Var(p^_k)`` of ``M(p^)``.

    ``g_k = dM/dp_k`` (`gradient`) and ``Var(p^_k) = (1 - f_k) s_k^2 / n_k`` are
    both taken at ``p_var`` (default the half-label smoothed proportions
    ``(h_k + 1/2) / (n_k + 1)``), so a stratum with no observed false negative
    yet still contributes, and the gradient of recall on the positive side does
    not vanish when no false negative has been seen (Krewski & Rao 1981,
    Sec. 2; Wolter 2007, "Introduction to Variance Estimation", Ch. 6).
    Infinite where a non-empty stratum has fewer than 2 labels.
    """
    N, n, h = _as_counts(N, n, h)
    p = half_label_smoothed(n, h) if p_var is None else np.asarray(p_var, dtype=float)
    g = gradient(metric, N, p, positive)
    var_k = stratum_variances(N, n, p, fpc)
    return np.sum(np.where(g != 0.0, g * g * var_k, 0.0), axis=-1)


def plug_in(metric: str, N, n, h, positive) -> np.ndarray:
    """``M(h/n)``; NaN where a non-empty stratum has no label yet."""
    N, n, h = _as_counts(N, n, h)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(n > 0, h / np.where(n > 0, n, 1.0), 0.0)
    missing = ((n == 0) & (N > 0)).any(axis=-1)
    return np.where(missing, np.nan, value(metric, N, p, positive))


def ratio_interval(metric: str, N, n, h, positive, confidence: float = 0.95, fpc: bool = True) -> Interval:
    """Wilson interval for a ratio metric (recall, F1) with the design-effect ``n_eff``.

    Recall is a domain proportion (the share of the truly positive items that
    the model flags) and F1 a ratio in [0, 1]; for both, Franco, Little,
    Louis & Slud (2019, "Comparative study of confidence intervals for
    proportions in complex sample surveys", J. Surv. Stat. Methodol. 7:334)
    find the Wilson interval on the Kish effective sample size
    ``n_eff = M (1 - M) / v`` among the few that keep their coverage with
    rare domains, where Wald collapses.  The pieces, as in
    `estimator.wilson_interval`:

    * ``v`` is the linearisation variance at the half-label smoothed
      proportions (`linearised_variance`), inflated by
      `STOPPING_VARIANCE_MARGIN`;
    * ``M`` inside ``n_eff`` is the metric of those smoothed proportions, so
      ``n_eff`` stays finite and positive when the plug-in estimate is 0 or 1
      (a recall with no false negative seen yet): the interval never
      collapses to zero width;
    * ``n_eff`` is never above the number of labels (Korn & Graubard 1998);
    * the plug-in takes each stratum's proportion with the first-order bias
      of adaptive allocation and stopping removed (`estimator.adaptive_shift`
      with the squared gradient as the stratum's weight in ``v``);
    * the interval is the score interval around that plug-in; the reported estimate is the
      plug-in itself, not the interval's centre, with the stopping rule's term only for a
      reading at the stop (`estimator.Interval`).
    NaN bounds where a non-empty stratum has fewer than 2 labels.
    """
    N, n, h = _as_counts(N, n, h)
    return moments_ratio_interval(metric, N, StratumMoments.of_counts(n, h), h, positive, confidence, fpc)


def moments_ratio_interval(metric: str, N, moments: StratumMoments, events, positive, confidence: float = 0.95,
                           fpc: bool = True) -> Interval:
    """`ratio_interval` from each stratum's moments of its outcomes: the labels' (`ratio_interval`)
    or the difference estimator's pseudo-outcomes (`difference.metric_interval`), whose stratum
    means estimate the same proportions ``p_k``.  The gradient and ``n_eff`` are taken at the
    guarded means (clipped into (0, 1): a pseudo-outcome's mean may fall outside), the variance is
    ``sum_k g_k^2`` times each stratum's guarded variance of its mean, and the adaptive-bias shift
    of the interval's centre (the estimate at the stop) is applied where the stratum's labels
    (`events`: its positive labels) hold at least `SHIFT_MIN_EVENTS` of its rarer class.  The
    estimate of a reading at any moment takes the allocation's term in every stratum: with the
    gate, the strata whose few labels hold no false negative yet kept their plain (too low) share
    and recall read +0.013 high at 1,000 labels on `fraud-rare` and `abuse-rare-weak`
    (`docs/decisions/reported-estimate.md`)."""
    N = np.asarray(N, dtype=float)
    n = moments.n
    z = z_value(confidence)
    shifted = ratio_shifts(metric, N, moments, events, positive, fpc)
    p_smooth, var = shifted.p_smooth, shifted.var
    missing = ((n == 0) & (N > 0)).any(axis=-1)  # as `plug_in`: NaN where the plain estimate is
    plain = value(metric, N, np.clip(moments.mean, 0.0, 1.0), positive)

    def corrected(shift) -> np.ndarray:
        return np.where(missing | ~np.isfinite(plain), np.nan,
                        value(metric, N, np.clip(moments.mean + shift, 0.0, 1.0), positive))

    est, now = corrected(shifted.at_stop), corrected(shifted.now)
    return ratio_wilson(est, now, value(metric, N, p_smooth, positive), var, n.sum(axis=-1), z)


def ratio_wilson(est, now, m_smooth, var, labels, z: float) -> Interval:
    """The Wilson interval of a ratio metric around `est` on ``n_eff = M (1 - M) / v`` taken at its
    guarded value ``M`` = `m_smooth` (`var` inflated by `STOPPING_VARIANCE_MARGIN`, never above
    `labels`), `reaching` that value; `now` the reported estimate.  A chunk's (`moments_ratio_interval`)
    and a window's (`pooled.interval_of_sums`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        n_eff = np.clip(m_smooth * (1.0 - m_smooth), 1e-300, None) / (var * STOPPING_VARIANCE_MARGIN)
    n_eff = np.minimum(n_eff, labels)
    p = np.clip(np.nan_to_num(est, nan=0.5), 0.0, 1.0)
    return reaching(wilson_score(p, n_eff, z, np.isfinite(var) & np.isfinite(est), est, np.sqrt(var), now), m_smooth)


def reaching(iv: Interval, m_smooth) -> Interval:
    """`iv` widened, where it has bounds, to reach the metric of the guarded means `m_smooth`.

    With few labels a ratio metric's plug-in and its guarded value part: no false negative among
    14 labels of 2,097 predicted negatives reads recall 1, while half a label's worth of them
    (``N_k / (2 (n_k + 1))``, 70 items) makes it 0.09.  The Wilson interval is centred on the first
    and its ``n_eff`` is taken at the second, so it could read [0.82, 1] and stop a chunk of 26
    positives at 32 labels with its recall at 0.75 (`simulate --stream --scenario burst` on a small
    chunk of `fraud-rare`, `docs/decisions/ratio-interval-reach.md`).  Both are estimates the labels
    allow; an interval that leaves one out claims more than the labels hold, so it is widened to
    it.  Once the labels are enough for the linearisation the two differ by far less than the
    half-width and nothing changes."""
    lower = np.where(np.isfinite(iv.lower), np.minimum(iv.lower, m_smooth), iv.lower)
    upper = np.where(np.isfinite(iv.upper), np.maximum(iv.upper, m_smooth), iv.upper)
    return replace(iv, lower=lower, upper=upper)


@dataclass(frozen=True)
class RatioShifts:
    """What a ratio metric's interval takes of its strata's moments (`ratio_shifts`)."""

    p_smooth: np.ndarray  # per stratum, the guarded mean clipped into (0, 1)
    var: np.ndarray  # the linearised variance at the guarded means
    at_stop: np.ndarray  # per stratum, the adaptive-bias shift with the stopping rule's term
    now: np.ndarray  # per stratum, the allocation's term alone


def ratio_shifts(metric: str, N, moments: StratumMoments, events, positive, fpc: bool) -> RatioShifts:
    """The linearised variance ``sum_k g_k^2 Var_k`` of a ratio metric at its strata's guarded means
    and, per stratum, the adaptive-bias shifts of the means (`estimator.shifts_of_means`, weights
    ``g_k^2``): the stopping rule's only where the stratum holds `SHIFT_MIN_EVENTS` of its rarer class
    (`events`: its positive labels), the allocation's everywhere (`moments_ratio_interval`)."""
    N = np.asarray(N, dtype=float)
    p_smooth = np.clip(moments.guarded_mean, 1e-9, 1.0 - 1e-9)
    g = gradient(metric, N, p_smooth, positive)
    with np.errstate(invalid="ignore"):  # 0 x inf where a stratum with no weight has < 2 labels: dropped
        var = np.sum(np.where(g != 0.0, g * g * moments.variances(N, fpc), 0.0), axis=-1)
    at_stop, now = shifts_of_means(N, moments.n, p_smooth, moments.spread, g * g, var, fpc)
    gate = np.minimum(events, moments.n - np.asarray(events, dtype=float)) >= SHIFT_MIN_EVENTS
    return RatioShifts(p_smooth, var, np.where(gate, at_stop, 0.0), now)


def correct_counts(n, h, positive) -> np.ndarray:
    """Labels saying "the prediction was right": ``h_k`` on positive strata, ``n_k - h_k`` on negative ones."""
    n = np.asarray(n)
    h = np.asarray(h)
    return np.where(np.asarray(positive, dtype=bool), h, n - h)


def population(metric: str, N, positive) -> np.ndarray:
    """Items `metric` is taken over, per row: the predicted positives for precision, all else."""
    N = np.asarray(N, dtype=float)
    if metric == "precision":
        return N[..., np.asarray(positive, dtype=bool)].sum(axis=-1)
    return N.sum(axis=-1)


def metric_interval(metric: str, N, n, h, positive, confidence: float = 0.95, fpc: bool = True) -> Interval:
    """The interval the service reports for `metric` (see the module docstring).  Undefined (NaN)
    where the metric has no population (`population`), as its `value` is: precision of a chunk
    with no predicted positive yet."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    empty = population(metric, N, positive) <= 0
    if not np.any(empty):
        return _metric_interval(metric, N, n, h, positive, confidence, fpc)
    if np.all(empty):
        return undefined_interval(np.shape(empty))
    stand_in = np.where(empty[..., None], 1.0, np.asarray(N, dtype=float))  # its interval is dropped
    return _metric_interval(metric, stand_in, n, h, positive, confidence, fpc).undefined_where(empty)


def _metric_interval(metric: str, N, n, h, positive, confidence: float, fpc: bool) -> Interval:
    if metric == "precision":
        pos = np.asarray(positive, dtype=bool)
        return wilson_interval(np.asarray(N)[..., pos], np.asarray(n)[..., pos], np.asarray(h)[..., pos],
                               confidence, fpc)
    if metric == "accuracy":
        return wilson_interval(N, n, correct_counts(n, h, positive), confidence, fpc)
    return ratio_interval(metric, N, n, h, positive, confidence, fpc)


def allocation_scale(metrics, N, n, h, positive, variances=None) -> np.ndarray:
    """Per stratum, the weight that turns Neyman shares ``N_k sigma_k`` into the
    allocation for the enabled `metrics` (`allocation.neyman_shares`' ``scale``).

    One metric: ``|g_k| / N_k`` with ``g_k = dM/dp_k`` (`gradient`) at the
    half-label smoothed proportions, i.e. Neyman allocation on the linearised
    variable (Druck & McCallum 2011, Sec. 4.2: optimal allocation on the
    standard deviation of the target's composite variable).  Several metrics
    share one sample and one ``delta``; the allocation minimises the sum of
    their squared variances, a smooth stand-in for the widest interval:
    ``n_k ~ sigma_k sqrt(sum_m v_m g_mk^2)`` with ``v_m`` the metric's current
    variance (`variances`, equal weights while any is unknown), so the metric
    whose interval is widest draws the labels.  For precision alone the
    scale is constant on the positive strata: today's allocation.
    """
    N, n, h = _as_counts(N, n, h)
    p = half_label_smoothed(n, h)
    grads = [gradient(m, N, p, positive) / np.where(N > 0, N, 1.0) for m in metrics]
    if variances is None:
        lam = [np.ones(N.shape[:-1])] * len(grads)
    else:
        v = [np.asarray(x, dtype=float) for x in variances]
        known = np.all([np.isfinite(x) & (x > 0) for x in v], axis=0)
        total = np.sum([np.where(known, x, 0.0) for x in v], axis=0)
        lam = [np.where(known, x / np.where(total > 0, total, 1.0), 1.0) for x in v]
    combined = sum(np.asarray(l)[..., None] * g * g for l, g in zip(lam, grads))
    return np.sqrt(combined)
