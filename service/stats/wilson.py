"""The arithmetic of the default interval: Wilson's score interval on Kish's effective sample size
of the stratified estimate, with the half-label guard, the adaptive-bias correction and the stopping
margin (`estimator.wilson_interval`, where the method is described and its sources cited).

One implementation for every caller, on arrays that broadcast over any leading axes (the last is
the stratum axis): the intervals the service reports (`estimator`, and through it `confusion` and
`difference`) and the label forecasts' search, which evaluates the interval at many label counts at
once (`widths.ClosedWidths`: counts of shape ``(..., G, K)`` against stratum sizes ``(..., 1, K)``).
So that the search stays fast, what depends only on the stratum sizes (`Strata`) and what the
formulas share of a stratum's draws (`Draws`) is computed once and passed in, and nothing here
checks its inputs (`estimator._as_counts` does, once) or silences numpy's warnings of a division
by zero or an invalid value, where the results are masked (the callers do, once around all they
call).
"""

from __future__ import annotations

import numpy as np

#: Variance inflation of the default interval for the sequential stopping rule: the design
#: stops the first time the *estimated* half-width is <= delta, so it stops preferentially where
#: the variance is underestimated (first-passage selection, Anscombe 1952;
#: docs/decisions/stopping-variance-margin.md).
STOPPING_VARIANCE_MARGIN = 1.035


class Strata:
    """Per stratum, what the formulas need of the stratum sizes ``N_k`` alone: whether the stratum
    has items, the finite population correction's ``N_k - 1`` and ``max(N_k, 1)``, and, given the
    weights ``W_k = N_k / N`` (`estimator.weights`), ``W_k^2`` and whether ``W_k > 0``.  Computed
    once for any number of label counts that broadcast against ``N``."""

    __slots__ = ("N", "nonempty", "less_one", "at_least_one", "W", "W2", "weighted")

    def __init__(self, N: np.ndarray, W: np.ndarray | None = None):
        self.N, self.nonempty = N, N > 0
        self.less_one, self.at_least_one = N - 1.0, np.maximum(N, 1.0)
        self.W = W
        self.W2, self.weighted = (None, None) if W is None else (W**2, W > 0)


class Draws:
    """Per stratum, what the formulas share of its ``n_k`` draws (labels, or the difference
    estimator's pseudo-outcomes): ``n_k + 1``, ``max(n_k, 1)``, ``max(n_k, 2)``, the guarded mean
    ``pbar_k`` and ``1 - pbar_k``, and given the positive labels ``h_k`` the plain proportion
    ``p_k = h_k / max(n_k, 1)``.  ``pbar`` defaults to the half-label smoothed proportion of the
    positives (`half_label_smoothed`); the difference estimator and the ratio metrics pass their
    outcomes' guarded means."""

    __slots__ = ("n", "plus_one", "at_least_one", "safe_n", "p", "pbar", "pbar_less")

    def __init__(self, n: np.ndarray, h: np.ndarray | None = None, pbar=None):
        self.n, self.plus_one = n, n + 1.0
        self.at_least_one, self.safe_n = np.maximum(n, 1.0), np.maximum(n, 2.0)
        self.p = None if h is None else h / self.at_least_one
        self.pbar = half_label_smoothed(n, h, self.plus_one) if pbar is None else pbar
        self.pbar_less = 1.0 - self.pbar


def half_label_smoothed(n, h, plus_one=None) -> np.ndarray:
    """``(h + 1/2) / (n + 1)``: each stratum proportion shrunk half a label toward
    1/2 (the Krichevsky-Trofimov / Jeffreys-posterior-mean estimate); `plus_one` is ``n + 1``
    if the caller has it (`Draws`).

    Used for the variance inside `estimator.wilson_interval` (a stratum whose few labels
    all agree must not contribute zero variance, the reason Wilson beats Wald)
    and, so that the allocation minimises exactly the variance the stopping
    rule tests, for sigma_k in the default allocation ``opt_track``.
    """
    n = np.asarray(n, dtype=float)
    h = np.asarray(h, dtype=float)
    return (h + 0.5) / (n + 1.0 if plus_one is None else plus_one)


def proportion_variances(S: Strata, n, safe_n, p, q, fpc: bool) -> np.ndarray:
    """Per stratum, the estimated variance of its proportion ``p^_k``: ``(1 - n_k/N_k) s_k^2 / n_k``
    with ``s_k^2 = n_k/(n_k-1) p_k q_k`` (Kumar & Raj, Eq. 3 and 6) at the given proportions ``p``
    and ``q = 1 - p``; ``safe_n`` is ``max(n, 2)`` (`mean_variances`)."""
    return mean_variances(S, n, safe_n, safe_n / (safe_n - 1.0) * p * q, fpc)


def mean_variances(S: Strata, n, safe_n, s2, fpc: bool) -> np.ndarray:
    """Per stratum, ``(1 - f_k) s2_k / n_k``: the variance of a stratum mean of ``n_k`` draws whose
    sample variance is ``s2_k`` (Kumar & Raj, Eq. 6), ``safe_n = max(n, 2)``.  With `fpc` the
    finite population correction ``f_k = n_k / N_k`` (Bennett & Carvalho 2010, Sec. 4), which never
    counts a stratum as fully known: a labelled census is corrected as if one item were still
    unlabelled (a reviewer's label is not ground truth), so no interval has zero width.  Infinite
    where a non-empty stratum has fewer than 2 labels (0 where a fully labelled stratum has, with
    `fpc`); 0 for an empty stratum."""
    f = np.where(S.nonempty, np.minimum(n, S.less_one) / S.at_least_one, 1.0) if fpc else 0.0
    var = np.clip(1.0 - f, 0.0, 1.0) * s2 / safe_n
    too_few = (n < 2) & S.nonempty
    if fpc:
        too_few = too_few & ~(S.N <= n)  # a fully labelled stratum is exact
    return np.where(S.nonempty, np.where(too_few, np.inf, var), 0.0)


def weighted_sum(S: Strata, var_k) -> np.ndarray:
    """``v = sum_k W_k^2 var_k`` over the strata with weight: the variance of the stratified
    estimate from its strata's (Kumar & Raj, Eq. 6)."""
    return np.sum(np.where(S.weighted, S.W2 * var_k, 0.0), axis=-1)


def guarded_variance(S: Strata, D: Draws, fpc: bool) -> np.ndarray:
    """`weighted_sum` of `proportion_variances` at the guarded means ``pbar`` (the half-label
    guard of `estimator.wilson_interval`): the variance its stopping rule tests."""
    return weighted_sum(S, proportion_variances(S, D.n, D.safe_n, D.pbar, D.pbar_less, fpc))


def mean_shifts(S: Strata, D: Draws, spread, g2, var, fpc: bool, now: bool = True):
    """Per stratum, the first-order bias correction of a stratum mean under adaptive allocation and
    the variance-based stopping rule (Wald's identity to first order, `estimator.adaptive_bias_corrected`):
    ``(g_k n_k/(n_k+1) + stop_k) Var_k`` with ``g_k = (1 - 2 pbar_k) / (2 pbar_k (1 - pbar_k))``,
    ``stop_k = g2_k (1 - 2 pbar_k) / (n_k v)`` and ``Var_k = spread_k / n_k`` (the plain variance
    ``spread`` of the draws, with the finite population correction if `fpc`).  ``g2`` is each
    stratum's weight in the variance ``v`` the stopping rule tests.

    Returns (with the stopping rule's term, without it): the first None if `var` is None, the
    second None unless `now`."""
    var_k = spread / D.at_least_one
    if fpc:
        var_k = var_k * np.clip(1.0 - D.n / S.at_least_one, 0.0, 1.0)
    two_pbar = 2.0 * D.pbar
    tilt = 1.0 - two_pbar
    allocation = tilt / (two_pbar * D.pbar_less) * D.n / D.plus_one
    without = allocation * var_k if now else None
    if var is None:
        return None, without
    v = np.asarray(var, dtype=float)[..., None]
    stop_slope = np.where(np.isfinite(v) & (v > 0), g2 * tilt / (D.at_least_one * v), 0.0)
    return (allocation + stop_slope) * var_k, without


def corrected_estimates(S: Strata, D: Draws, var, fpc: bool, now: bool = True):
    """The stratified estimate ``sum_k W_k p_k`` (Kumar & Raj, Eq. 4) of the labels' proportions
    shifted by `mean_shifts` (weights ``W_k^2``, spread ``p_k (1 - p_k)``), NaN where a weighted
    stratum has no label: (with the stopping rule's term, without it), as `mean_shifts` returns them."""
    missing = ((D.n == 0) & S.weighted).any(axis=-1)

    def estimate(shift):
        if shift is None:
            return None
        return np.where(missing, np.nan, np.sum(S.W * np.clip(D.p + shift, 0.0, 1.0), axis=-1))

    at_stop, without = mean_shifts(S, D, D.p * (1.0 - D.p), S.W2, var, fpc, now)
    return estimate(at_stop), estimate(without)


def design_effect(est, var, n_total):
    """Kish's effective sample size of the estimate `est` with variance `var` inflated by
    `STOPPING_VARIANCE_MARGIN`: ``n_eff = p (1 - p) / v`` at ``p = est`` clipped into [0, 1], but
    the labels `n_total` where ``p`` is 0 or 1 (Korn & Graubard 1998) and 0 where ``v`` is infinite.
    Returns ``(p, n_eff, ok)``, ``ok`` where the variance and the estimate are finite."""
    var = var * STOPPING_VARIANCE_MARGIN
    p = np.clip(est, 0.0, 1.0)
    n_eff = np.where(var > 0, np.maximum(p * (1 - p), 1e-300) / var, np.inf)
    n_eff = np.minimum(n_eff, np.where(np.isfinite(var), np.inf, 0.0))
    n_eff = np.where((p <= 0) | (p >= 1), n_total, n_eff)
    return p, n_eff, np.isfinite(var) & np.isfinite(est)


def score_bounds(p, n_eff, z: float, ok):
    """Wilson's (1927) score interval for a proportion `p` on `n_eff` observations at the normal
    quantile `z`: ``(p + z^2/2n) / (1 + z^2/n) -+ z / (1 + z^2/n) sqrt(p (1 - p)/n + z^2/4n^2)``,
    clipped into [0, 1].  Returns (lower, upper, where they exist): NaN bounds where not `ok` or
    ``n_eff`` is not positive."""
    z2n = z * z / n_eff
    center = (p + z2n / 2.0) / (1.0 + z2n)
    half = z / (1.0 + z2n) * np.sqrt(p * (1 - p) / n_eff + z2n / (4.0 * n_eff))
    ok = ok & (n_eff > 0)
    lower = np.where(ok, np.clip(center - half, 0.0, 1.0), np.nan)
    return lower, np.where(ok, np.clip(center + half, 0.0, 1.0), np.nan), ok
