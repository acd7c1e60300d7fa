"""The half-widths a closed chunk's precision interval would have at many label counts at once:
the inner loop of the label forecasts' search (`streams.labels_to_reach`), out of `streams` so that
the sampling design reads apart from it.  The interval is `estimator.wilson_interval`'s own
arithmetic (`wilson`), evaluated on counts of shape ``(..., G, K)``."""

from __future__ import annotations

import numpy as np

from .estimator import _as_counts, weights, z_value
from .wilson import Draws, Strata, corrected_estimates, design_effect, guarded_variance, score_bounds


class ClosedWidths:
    """Half-widths of a closed chunk's precision interval (`chunk_interval` with ``closed``:
    `estimator.wilson_interval` with the finite population correction) at the counts
    ``m_k = min(t n_k, cap_k)`` and positives ``p_k m_k``, for many factors ``t`` at once.

    The same functions as `estimator.wilson_interval`, so the same numbers
    (`tests/unit/test_streams_search.py` holds the two equal on random chunks): the guarded
    stratified variance at the half-label proportions (`wilson.guarded_variance`: Kumar & Raj,
    Eq. 3 and 6), the adaptive-bias corrected estimate (`wilson.corrected_estimates`: Wald's
    identity, to first order), Kish's ``n_eff`` with the stopping margin (`wilson.design_effect`)
    and Wilson's (1927) score interval (`wilson.score_bounds`).  What depends only on the stratum
    sizes (`wilson.Strata`: the weights, the correction's denominators) is computed once per call,
    the counts' validation (`estimator._as_counts`) once at ``t = 1`` (growing the counts keeps
    them valid), and nothing the half-width does not need (the standard error, the estimate
    without the stopping rule's term)."""

    def __init__(self, N, n, p, cap, confidence: float):
        with np.errstate(invalid="ignore"):  # inf labels: refused by _as_counts, not warned about
            _as_counts(N, n, p * n)  # what the interval refuses, it refuses at today's counts
        row = lambda a: a[..., None, :]  # noqa: E731  (..., 1, K) against (..., G, K)
        self.strata = Strata(row(N), row(weights(N)))
        self.n, self.cap, self.p = row(n), row(cap), row(p)
        self.z = z_value(confidence)

    def __call__(self, t) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            m = np.minimum(self.n * t[..., None], self.cap)
            draws = Draws(m, self.p * m)
            var = guarded_variance(self.strata, draws, True)
            est, _ = corrected_estimates(self.strata, draws, var, True, now=False)
            p, n_eff, ok = design_effect(est, var, m.sum(axis=-1))
            lower, upper, _ = score_bounds(p, n_eff, self.z, ok)
        return (upper - lower) / 2.0
