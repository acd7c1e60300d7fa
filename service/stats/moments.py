"""Per-stratum moments of the outcomes an interval is computed from, beyond the counts.

The plain estimator (`estimator`) needs of each stratum only its labels ``n_k`` and positives
``h_k``.  The intervals built on it by moments need the outcomes' mean and spread, with and
without the half-label guard: the ratio metrics' linearised interval
(`confusion.moments_ratio_interval`, from the labels: `StratumMoments.of_counts`) and the
difference estimator's (`difference`, from the pseudo-outcomes, real numbers:
`StratumMoments.of_outcomes`).  Pure numpy, over a last stratum axis as in `estimator`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .estimator import half_label_smoothed, variance_of_mean


@dataclass(frozen=True)
class StratumMoments:
    """Per stratum (last axis), what the intervals need of the draws' outcomes: the labels
    ``n``, the mean and plain spread (divided by ``n``, as ``p (1 - p)``) of the outcomes, and
    both with the half-label guard (half a label at outcome 1 and at 0, `estimator.half_label_smoothed`).

    For labels (outcome 0 or 1, `of_counts`) these are ``h/n``, ``p (1 - p)``, ``(h + 1/2)/(n + 1)``
    and its ``p (1 - p)``; for the difference estimator's pseudo-outcomes (`of_outcomes`,
    `difference`) the same moments of real numbers."""

    n: np.ndarray
    mean: np.ndarray
    spread: np.ndarray
    guarded_mean: np.ndarray
    guarded_spread: np.ndarray

    @classmethod
    def of_counts(cls, n, h) -> "StratumMoments":
        """The moments of ``h`` positive labels out of ``n``, as `estimator.wilson_interval` computes them."""
        n = np.asarray(n, dtype=float)
        p = np.asarray(h, dtype=float) / np.maximum(n, 1.0)
        pbar = half_label_smoothed(n, h)
        return cls(n, p, p * (1.0 - p), pbar, pbar * (1.0 - pbar))

    @classmethod
    def of_outcomes(cls, k: int, stratum, z) -> "StratumMoments":
        """The moments of outcomes `z` drawn in `stratum` (one each; ``k`` strata)."""
        z = np.asarray(z, dtype=float)
        stratum = np.asarray(stratum, dtype=int)
        n = np.bincount(stratum, minlength=k).astype(float)
        s1 = np.bincount(stratum, weights=z, minlength=k)
        s2 = np.bincount(stratum, weights=z * z, minlength=k)
        safe = np.maximum(n, 1.0)
        mean = s1 / safe
        guarded_mean = (s1 + 0.5) / (n + 1.0)
        return cls(n, mean, np.maximum(s2 / safe - mean * mean, 0.0), guarded_mean,
                   np.maximum((s2 + 0.5) / (n + 1.0) - guarded_mean * guarded_mean, 0.0))

    def variances(self, N, fpc: bool = True) -> np.ndarray:
        """Per stratum, the guarded variance of its mean (`estimator.variance_of_mean` of ``n/(n-1)``
        times the guarded spread; `estimator.stratum_variances` at the half-label smoothed proportion
        for labels)."""
        safe_n = np.maximum(self.n, 2.0)
        return variance_of_mean(N, self.n, safe_n / (safe_n - 1.0) * self.guarded_spread, fpc)
