"""The half-widths a closed chunk's precision interval would have at many label counts at once:
the inner loop of the label forecasts' search (`streams.labels_to_reach`), a fused copy of
`estimator.wilson_interval` with the finite population correction, to become one implementation
with it (issue 48; out of `streams` so that the sampling design reads apart from it)."""

from __future__ import annotations

import numpy as np

from .estimator import STOPPING_VARIANCE_MARGIN, _as_counts, weights, z_value


class ClosedWidths:
    """Half-widths of a closed chunk's precision interval (`chunk_interval` with ``closed``:
    `estimator.wilson_interval` with the finite population correction) at the counts
    ``m_k = min(t n_k, cap_k)`` and positives ``p_k m_k``, for many factors ``t`` at once.

    The same operations in the same order as `estimator.wilson_interval`, so the same numbers
    (`tests/unit/test_streams_search.py` holds the two equal on random chunks): the guarded
    stratified variance ``v = sum_k W_k^2 (1 - f_k) s_k^2 / n_k`` with ``s_k^2 = n/(n-1) pbar
    (1 - pbar)`` at ``pbar_k = (h_k + 1/2)/(n_k + 1)`` (Kumar & Raj, Eq. 3 and 6), the
    adaptive-bias corrected estimate (`estimator.adaptive_shift`: Wald's identity, to first
    order), the stopping margin, Kish's ``n_eff = p (1 - p) / v`` and Wilson's (1927) score
    interval at its centre (`estimator.wilson_design_effect`).  What depends only on the
    stratum sizes (weights, the correction's denominators) is computed once per call, the
    counts' validation (`estimator._as_counts`) once at ``t = 1`` (growing the counts keeps
    them valid), and nothing the half-width does not need (the standard error)."""

    def __init__(self, N, n, p, cap, confidence: float):
        with np.errstate(invalid="ignore"):  # inf labels: refused by _as_counts, not warned about
            _as_counts(N, n, p * n)  # what the interval refuses, it refuses at today's counts
        W = weights(N)
        row = lambda a: a[..., None, :]  # noqa: E731  (..., 1, K) against (..., G, K)
        self.n, self.cap, self.p, self.N = row(n), row(cap), row(p), row(N)
        self.W, self.W2 = row(W), row(W**2)
        self.stratum, self.weighted = self.N > 0, self.W > 0
        self.N_less_one, self.N_at_least_one = self.N - 1.0, np.maximum(self.N, 1.0)
        self.z = z_value(confidence)

    def __call__(self, t) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            return self._halfwidths(t)

    def _halfwidths(self, t) -> np.ndarray:
        N, W, W2, stratum = self.N, self.W, self.W2, self.stratum
        m = np.minimum(self.n * t[..., None], self.cap)
        h = self.p * m
        # estimator.stratified_variance at the half-label proportions (stratum_variances, variance_of_mean)
        m_plus_one = m + 1.0
        pbar = (h + 0.5) / m_plus_one
        one_less = 1.0 - pbar
        safe_n = np.maximum(m, 2.0)
        s2 = safe_n / (safe_n - 1.0) * pbar * one_less
        f = np.where(stratum, np.minimum(m, self.N_less_one) / self.N_at_least_one, 1.0)
        var_k = np.clip(1.0 - f, 0.0, 1.0) * s2 / safe_n
        too_few = (m < 2) & stratum & ~(N <= m)
        var_k = np.where(stratum, np.where(too_few, np.inf, var_k), 0.0)
        var = np.sum(np.where(self.weighted, W2 * var_k, 0.0), axis=-1)
        # estimator.adaptive_bias_corrected (adaptive_shift, shift_of_means) with the correction
        missing = ((m == 0) & self.weighted).any(axis=-1)  # stratified_estimate is NaN
        m_at_least_one = np.maximum(m, 1.0)
        p_k = h / m_at_least_one
        spread_k = p_k * (1.0 - p_k) / m_at_least_one
        spread_k = spread_k * np.clip(1.0 - m / self.N_at_least_one, 0.0, 1.0)
        two_pbar = 2.0 * pbar
        tilt = 1.0 - two_pbar
        g = tilt / (two_pbar * one_less)
        v = var[..., None]
        stop_slope = np.where(np.isfinite(v) & (v > 0), W2 * tilt / (m_at_least_one * v), 0.0)
        shift = (g * m / m_plus_one + stop_slope) * spread_k
        est = np.sum(W * np.clip(p_k + shift, 0.0, 1.0), axis=-1)
        est = np.where(missing, np.nan, est)
        # estimator.wilson_design_effect and wilson_score
        var = var * STOPPING_VARIANCE_MARGIN
        p = np.clip(est, 0.0, 1.0)
        pq = p * (1 - p)
        n_eff = np.where(var > 0, np.maximum(pq, 1e-300) / var, np.inf)
        n_eff = np.minimum(n_eff, np.where(np.isfinite(var), np.inf, 0.0))
        n_eff = np.where((p <= 0) | (p >= 1), m.sum(axis=-1), n_eff)
        ok = np.isfinite(var) & np.isfinite(est) & (n_eff > 0)
        z = self.z
        z2n = z * z / n_eff
        center = (p + z2n / 2.0) / (1.0 + z2n)
        half = z / (1.0 + z2n) * np.sqrt(pq / n_eff + z2n / (4.0 * n_eff))
        upper, lower = np.clip(center + half, 0.0, 1.0), np.clip(center - half, 0.0, 1.0)
        return np.where(ok, (upper - lower) / 2.0, np.nan)
