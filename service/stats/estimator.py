"""The stratified estimator of precision, its variance and confidence intervals.

Notation (Kumar & Raj, Sec. 3.2; Bennett & Carvalho 2010, Eq. 1): stratum
``k`` has ``N_k`` predicted-positive items (weight ``W_k = N_k / N``), ``n_k``
of them labelled, ``h_k`` of those truly positive.  All functions take numpy
arrays whose last axis is the stratum axis, so the simulator evaluates
thousands of runs in one call and the service one classifier.  The arithmetic of the variance,
the adaptive-bias correction and the Wilson interval, which the label forecasts' search shares
(`widths`): `wilson`; the moments of outcomes other than the counts (the difference estimator's,
the ratio metrics'): `moments`; the labels a design knowing the true precisions would need: `oracle`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy.stats import norm

from .wilson import (
    Draws,
    Strata,
    corrected_estimates,
    design_effect,
    guarded_variance,
    mean_shifts,
    mean_variances,
    proportion_variances,
    score_bounds,
    weighted_sum,
)
from .wilson import STOPPING_VARIANCE_MARGIN, half_label_smoothed  # noqa: F401  (part of this module's interface)

INTERVALS: tuple[str, ...] = ("wilson", "normal")


@functools.lru_cache(maxsize=64)
def z_value(confidence: float) -> float:
    """Two-sided standard normal quantile for the given confidence level (cached: every
    interval of every classifier at every scrape asks for one of a few levels)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    return float(norm.ppf(0.5 + confidence / 2.0))


def _as_counts(N, n, h) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    h = np.asarray(h, dtype=float)
    if not np.all(np.isfinite(N)):
        raise ValueError("stratum sizes must be finite numbers (got NaN or inf)")
    if not (np.all(np.isfinite(n)) and np.all(np.isfinite(h))):
        raise ValueError("label and positive counts must be finite numbers (got NaN or inf)")
    if np.any(n < 0) or np.any(h < 0) or np.any(h > n):
        raise ValueError("counts must satisfy 0 <= positives <= labels in every stratum")
    if np.any(N < 0):
        raise ValueError("stratum sizes must be >= 0")
    return N, n, h


def weights(N) -> np.ndarray:
    """Stratum weights ``W_k = N_k / N`` (Kumar & Raj, Eq. 4)."""
    N = np.asarray(N, dtype=float)
    if not np.all(np.isfinite(N)):
        raise ValueError("stratum sizes must be finite numbers (got NaN or inf)")
    total = N.sum(axis=-1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError("the population is empty: all stratum sizes are 0")
    return N / total


def stratified_estimate(N, n, h) -> np.ndarray:
    """Unbiased stratified precision ``sum_k W_k h_k / n_k`` (Kumar & Raj, Eq. 4).

    NaN where a non-empty stratum has no label yet: no unbiased estimate exists
    then, and the caller must not report one.
    """
    N, n, h = _as_counts(N, n, h)
    W = weights(N)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_k = np.where(n > 0, h / np.where(n > 0, n, 1.0), np.nan)
    missing = (n == 0) & (W > 0)
    p_k = np.where(W > 0, p_k, 0.0)
    est = np.sum(W * np.nan_to_num(p_k), axis=-1)
    return np.where(missing.any(axis=-1), np.nan, est)


def stratum_variances(N, n, p, fpc: bool = True) -> np.ndarray:
    """Per stratum, the estimated variance of its proportion ``p^_k``:
    ``(1 - n_k/N_k) s_k^2 / n_k`` with ``s_k^2 = n_k/(n_k-1) p_k (1-p_k)``
    (Kumar & Raj, Eq. 3 and 6), at the given proportions ``p``.

    The finite population correction never counts a stratum as fully known: a
    labelled census is corrected as if one item were still unlabelled (a
    reviewer's label is not ground truth), so no interval has zero width.
    Infinite where a non-empty stratum has fewer than 2 labels (0 where a
    fully labelled stratum has, with ``fpc``); 0 for an empty stratum.
    """
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    p = np.asarray(p, dtype=float)
    return proportion_variances(Strata(N), n, np.maximum(n, 2.0), p, 1.0 - p, fpc)


def variance_of_mean(N, n, s2, fpc: bool = True) -> np.ndarray:
    """Per stratum, ``(1 - n_k/N_k) s2_k / n_k``: the variance of a stratum mean of ``n_k``
    draws whose sample variance is ``s2_k`` (`stratum_variances` for a proportion; the
    difference estimator's residuals, `difference`), with the same finite population
    correction and the same infinities where a stratum has fewer than 2 labels."""
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    return mean_variances(Strata(N), n, np.maximum(n, 2.0), s2, fpc)


def stratified_variance(N, n, h, fpc: bool = True, p_var=None) -> np.ndarray:
    """Estimated variance of the stratified estimator (Kumar & Raj, Eq. 6).

    ``v = sum_k W_k^2 (1 - n_k/N_k) s_k^2 / n_k`` (`stratum_variances`); the
    factor ``(1 - n_k/N_k)`` is the finite population correction, used when
    sampling without replacement (Bennett & Carvalho 2010, Sec. 4).
    ``p_var`` optionally replaces the per-stratum proportion used inside
    ``s_k^2`` (see `wilson_interval`).  Infinite where a non-empty stratum has
    fewer than 2 labels.
    """
    N, n, h = _as_counts(N, n, h)
    S = Strata(N, weights(N))
    p_k = h / np.maximum(n, 1.0) if p_var is None else np.asarray(p_var, dtype=float)
    return weighted_sum(S, proportion_variances(S, n, np.maximum(n, 2.0), p_k, 1.0 - p_k, fpc))


@dataclass(frozen=True)
class Interval:
    """A point estimate with its confidence interval (arrays over runs).

    ``estimate`` is the point estimate of a reading taken at any moment (a fixed budget, an open
    chunk read by a dashboard): the stratified estimate with the first-order bias of adaptive
    allocation removed (`adaptive_bias_corrected` with ``stop=False``), never moved toward 1/2 by
    the interval's construction, so it need not sit at the interval's centre.  ``at_stop`` is the
    estimate of a reading taken where the variance-based stopping rule stopped (the stopping-rule
    term too); None where it is the same as ``estimate``: read it as `estimate_at_stop`."""

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    stderr: np.ndarray
    at_stop: np.ndarray | None = None

    @property
    def halfwidth(self) -> np.ndarray:
        return (self.upper - self.lower) / 2.0

    @property
    def estimate_at_stop(self) -> np.ndarray:
        """The estimate of a reading taken at the stopping rule's stop (see the class docstring)."""
        return self.estimate if self.at_stop is None else self.at_stop

    def reading(self, stopped) -> np.ndarray:
        """`estimate_at_stop` where `stopped` (over runs), `estimate` elsewhere."""
        return np.where(stopped, self.estimate_at_stop, self.estimate)

    def row(self, r: int) -> "Interval":
        """The interval of run `r` (fields over runs)."""
        return Interval(self.estimate[r], self.lower[r], self.upper[r], self.stderr[r], self.estimate_at_stop[r])

    def undefined_where(self, mask) -> "Interval":
        """This interval with every field NaN where `mask` (over runs) is true."""
        fields = ("estimate", "lower", "upper", "stderr", "estimate_at_stop")
        return Interval(*(np.where(mask, np.nan, getattr(self, f)) for f in fields))


def undefined_interval(shape=()) -> Interval:
    """An interval whose every field is NaN, over runs of `shape`: a metric with no population."""
    nothing = np.full(shape, np.nan)
    return Interval(nothing, nothing, nothing, nothing)


def normal_interval(N, n, h, confidence: float = 0.95, fpc: bool = True) -> Interval:
    """The normal interval ``p +- z * se`` of Bennett & Carvalho (2010, Sec. 5),
    with the paper's m-estimate smoothing of each stratum proportion
    (`bennett_smoothed`) in both the estimate and the variance.

    It under-covers at small n and near p = 1: a run whose first labels are all
    positive gets a tiny variance and stops with estimate ~1.  Kept for
    comparison; the service uses `wilson_interval`.
    """
    N, n, h = _as_counts(N, n, h)
    W = weights(N)
    p_k = bennett_smoothed(n, h)
    est = np.sum(W * p_k, axis=-1)
    f = n / np.maximum(N, 1.0) if fpc else 0.0
    var = np.sum(W**2 * np.clip(1.0 - f, 0.0, 1.0) * p_k * (1 - p_k) / np.maximum(n, 1.0), axis=-1)
    var = np.where(((n == 0) & (W > 0)).any(axis=-1), np.inf, var)
    se = np.sqrt(var)
    z = z_value(confidence)
    return Interval(est, np.clip(est - z * se, 0, 1), np.clip(est + z * se, 0, 1), se)


def bennett_smoothed(n, h) -> np.ndarray:
    """m-estimate ``(h + m/2) / (n + m)`` with ``m = 2`` if ``n = 0`` else
    ``1/sqrt(n)`` (Bennett & Carvalho 2010, Sec. 5, prior 0.5)."""
    n = np.asarray(n, dtype=float)
    h = np.asarray(h, dtype=float)
    m = np.where(n > 0, 1.0 / np.sqrt(np.maximum(n, 1.0)), 2.0)
    return (h + m / 2.0) / (n + m)


def adaptive_bias_corrected(N, n, h, var=None, fpc: bool = False, stop: bool = True) -> np.ndarray:
    """Stratified estimate with the first-order bias of data-dependent ``n_k`` removed.

    With adaptive (Neyman-tracking) allocation and a variance-based stopping
    rule, ``n_k`` depends on the stratum's own labels, and the plain mean
    ``p_k = h_k/n_k`` is biased: by Wald's identity ``E[n_k (p_k - P_k)] = 0``,
    so ``E[p_k] - P_k = -Cov(n_k, p_k) / E[n_k]`` (Wald 1945).  To first order
    (delta method) ``Cov(n_k, p_k) / n_k = (d log n_k / d p_k) Var(p_k)`` with
    two sources of ``d log n_k / d p_k``:

    * the allocation (``opt_track`` tracks ``n_k ~ N_k sigma(pbar_k)`` with
      ``pbar_k = (h_k + 1/2)/(n_k + 1)``):  ``g_k n_k/(n_k+1)`` where
      ``g_k = d log sigma / d p = (1 - 2 pbar_k) / (2 pbar_k (1 - pbar_k))``;
    * the stopping rule (``n`` grows until ``v`` falls below a target, so
      ``log n`` moves with ``log v``): ``W_k^2 (1 - 2 pbar_k) / (n_k v)``.

    With the plug-in ``Var(p_k) = p_k (1 - p_k) / n_k`` the correction is zero
    for a pure stratum (whose sample size cannot depend on a variation it has
    not shown) and of order ``1/n_k``.  Measured on the built-in populations
    (4000 runs) it removes the +0.1..+0.3 sd bias that made the default design
    miss the target InConf near precision 1; for non-adaptive designs it is an
    O(1/n) shift (the stopping-rule part still applies to them).
    Without ``stop`` only the allocation's term is removed: the estimate of a reading not taken
    at the stopping rule's stop (a fixed budget, an open chunk; `Interval.estimate`), where the
    stopping-rule term would move it by about ``-(1 - 2 p) / n`` of its variance (-0.004 at 100
    labels on `calibrated`).
    With ``fpc`` (sampling without replacement) ``Var(p_k)`` carries the finite
    population correction, so a fully labelled stratum is taken as exact.
    `stratified_estimate` stays the plain, unbiased-for-fixed-n estimator.
    """
    N, n, h = _as_counts(N, n, h)
    S, D = Strata(N, weights(N)), Draws(n, h)
    if var is None:  # `stratified_variance` at the half-label proportions
        var = guarded_variance(S, D, True)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_stop, now = corrected_estimates(S, D, var if stop else None, fpc, not stop)
    return at_stop if stop else now


def adaptive_shift(N, n, h, g2, var, fpc: bool = False, stop: bool = True) -> np.ndarray:
    """Per stratum, the first-order bias correction of ``p_k = h_k / n_k`` under
    adaptive allocation and the variance-based stopping rule (see
    `adaptive_bias_corrected`): ``(g_k n_k/(n_k+1) + stop_k) Var(p_k)`` with
    ``stop_k = g2_k (1 - 2 pbar_k) / (n_k v)``.

    ``g2`` is each stratum's weight in the variance ``v = sum_k g2_k Var(p_k)``
    the stopping rule tests: ``W_k^2`` for a stratified mean, the squared
    gradient ``(dM/dp_k)^2`` for a linearised metric (`confusion`).  Without ``stop``, the
    allocation's term alone (``stop_k = 0``).
    """
    N, n, h = (np.asarray(a, dtype=float) for a in (N, n, h))
    D = Draws(n, h)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_stop, now = mean_shifts(Strata(N), D, D.p * (1.0 - D.p), g2, var if stop else None, fpc, not stop)
    return at_stop if stop else now


def shift_of_means(N, n, pbar, spread, g2, var, fpc: bool = False, stop: bool = True) -> np.ndarray:
    """`adaptive_shift` from a stratum's smoothed mean ``pbar`` and the plain (divide by
    ``n``) variance ``spread`` of its draws: ``p (1 - p)`` for labels, the residual
    spread for the difference estimator (`difference`); the stopping rule's term only with
    ``stop``."""
    S, D = Strata(np.asarray(N, dtype=float)), Draws(np.asarray(n, dtype=float), pbar=pbar)
    with np.errstate(divide="ignore", invalid="ignore"):
        at_stop, now = mean_shifts(S, D, spread, g2, var if stop else None, fpc, not stop)
    return at_stop if stop else now


def shifts_of_means(N, n, pbar, spread, g2, var, fpc: bool = False) -> tuple[np.ndarray | None, np.ndarray]:
    """`shift_of_means` with the stopping rule's term and without it, in one pass (the same
    numbers); with `var` None, (None, without it)."""
    S, D = Strata(np.asarray(N, dtype=float)), Draws(np.asarray(n, dtype=float), pbar=pbar)
    with np.errstate(divide="ignore", invalid="ignore"):
        return mean_shifts(S, D, spread, g2, var, fpc)


def wilson_interval(N, n, h, confidence: float = 0.95, fpc: bool = True, adaptive: bool = True) -> Interval:
    """Wilson score interval with the design-effect effective sample size.

    For a stratified (complex-sample) proportion, Kott & Carr (1997) and
    Dean & Pagano (2015, "Evaluating confidence interval methods for binomial
    proportions in clustered surveys", J. Surv. Stat. Methodol. 3:484) replace
    ``n`` in Wilson's (1927) score interval by the effective sample size
    ``n_eff = p (1 - p) / v`` (Kish's design effect), which keeps Wilson's
    good small-sample coverage near 0 and 1 while reducing to ``p +- z se``
    when n is large.

    Two guards make it honest at small n, where the normal interval is not:
    * inside ``v`` a stratum's proportion is shrunk half a label toward 1/2,
      ``(h_k + 1/2) / (n_k + 1)``, so a stratum whose few labels all agree does
      not contribute zero variance (the same reason Wilson beats Wald);
    * ``n_eff`` is never above what the labels can support: if every stratum
      is pure, ``n_eff`` is the total label count (Korn & Graubard 1998).

    The interval is Wilson's score interval around the bias-corrected stratified estimate
    (`adaptive_bias_corrected`, both terms: the bounds are what the stopping rule tests), its
    variance inflated by `STOPPING_VARIANCE_MARGIN` (see there).  The reported estimate is not the
    interval's centre, which sits ``(p - 1/2) z^2 / (n_eff + z^2)`` toward 1/2 (Agresti & Coull
    1998, Am. Stat. 52:119): that shrinkage made the headline number wrong whenever labels were
    few.  It is the stratified estimate with the allocation's bias term (`Interval.estimate`) and,
    for a reading at the stop, the stopping rule's too (`Interval.estimate_at_stop`); near p = 1 it
    sits near the top of the asymmetric interval.  ``stderr`` is the plain standard error, without
    the margin.
    Not `adaptive` (a sample whose sizes ``n_k`` were fixed in advance and not stopped by the
    rule: simple random sampling at a fixed budget), the interval is around the plain stratified
    estimate, which is then also the reported one.
    Returns NaN bounds (and the estimates) where a non-empty stratum has fewer than 2 labels.
    """
    N, n, h = _as_counts(N, n, h)
    S, D = Strata(N, weights(N)), Draws(n, h)
    # stratified_variance at the half-label proportions, and both estimates: the counts checked once
    var = guarded_variance(S, D, fpc)
    if not adaptive:
        plain = stratified_estimate(N, n, h)
        return wilson_design_effect(plain, var, n.sum(axis=-1), z_value(confidence))
    with np.errstate(divide="ignore", invalid="ignore"):
        est, now = corrected_estimates(S, D, var, fpc)
    return wilson_design_effect(est, var, n.sum(axis=-1), z_value(confidence), now)


def wilson_design_effect(est, var, n_total, z: float, now=None) -> Interval:
    """`wilson_interval` from the bias-corrected estimate `est` (both terms), its guarded variance
    `var` and the labels `n_total` (also the difference estimator's, `difference`): the variance
    inflated by `STOPPING_VARIANCE_MARGIN`, ``n_eff = p (1 - p) / v`` (the labels when ``p`` is 0
    or 1, Korn & Graubard), the score interval around ``p = est``.  `now` is the estimate of a
    reading at any moment (`Interval.estimate`; default `est`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        p, n_eff, ok = design_effect(est, var, n_total)
    return wilson_score(p, n_eff, z, ok, est, np.sqrt(var), now)


def wilson_score(p, n_eff, z: float, ok, est, se, now=None) -> Interval:
    """Wilson's (1927) score interval for a proportion `p` on `n_eff` observations, with `now` as
    the reported estimate and `est` as the estimate at the stop (`Interval`); NaN bounds where not
    `ok` or ``n_eff`` is not positive."""
    with np.errstate(divide="ignore", invalid="ignore"):
        lower, upper, ok = score_bounds(p, n_eff, z, ok)
    est = np.asarray(est, dtype=float)
    if now is None:
        return Interval(est, lower, upper, se, est)
    # never outside the interval it is reported with: the two estimates differ by the stopping term
    # only, which can leave `now` a rounding error past a bound where the interval has no width
    now = np.where(ok, np.clip(np.asarray(now, dtype=float), lower, upper), now)
    return Interval(now, lower, upper, se, est)


def interval(N, n, h, confidence: float = 0.95, method: str = "wilson", fpc: bool = True) -> Interval:
    """Dispatch to `wilson_interval` (default) or `normal_interval`."""
    if method == "wilson":
        return wilson_interval(N, n, h, confidence, fpc)
    if method == "normal":
        return normal_interval(N, n, h, confidence, fpc)
    raise ValueError(f"interval must be one of {INTERVALS}, got {method!r}")
