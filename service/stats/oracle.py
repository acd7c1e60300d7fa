"""The oracles: the labels a design would need if it knew the true stratum precisions.

`neyman_oracle_labels` (Bennett & Carvalho 2010, "%Oracle";
Kumar & Raj, Eq. 10) is the label count of Neyman allocation when the stratum
precisions are known and the *true* variance ``sum_k W_k^2 P_k (1-P_k)/n_k``
is held to ``(delta/z)^2``.  No design that estimates the variance from its
labels can reach it where a stratum is nearly pure: the oracle gives a
stratum with ``P_k = 0.9998`` a handful of labels, all positive, and an
interval that took those labels at face value would call the stratum exact.

The default interval (`estimator.wilson_interval`) instead shrinks every
stratum proportion half a label toward 1/2 inside its variance (the Jeffreys
posterior mean, `estimator.half_label_smoothed`), so a pure stratum with
``n`` labels still contributes about ``W^2 / (2 n^2)``.  The Jeffreys oracle
is the label count of the *best* allocation, one that knows the true ``P_k``,
when that smoothed variance, in expectation over the labels, must reach
``(delta/z)^2``: the floor of every design that stops on the default
interval, whatever its allocation.  Neither a weaker pull toward 1/2 nor a
pull toward the stratum's true precision is an honest way under that floor:
measured in docs/development/label-efficiency.md ("The Neyman bar and the honest floor"), a
quarter-label pull drops InConf to 0.93 on `calibrated`, whose top stratum
holds a few errors in hundreds of labels, and one pseudo-label at the true
precision to 0.87-0.91 on four populations.  The half label corrects the skew
of a variance estimated from few minority labels, not ignorance of ``P_k``.
"""

from __future__ import annotations

import numpy as np

from .estimator import weights, z_value

#: Every non-empty stratum needs two labels before the interval exists.
MIN_LABELS = 2.0


def neyman_oracle_labels(N, p_true, delta: float, confidence: float = 0.95, fpc: bool = False) -> float:
    """Labels the normal interval needs for half-width `delta` under Neyman
    allocation with the true stratum precisions (Kumar & Raj, Eq. 10;
    Bennett & Carvalho 2010, "%Oracle"): ``n = z^2 (sum W_k S_k)^2 / delta^2``,
    or with the finite population correction
    ``n = (sum W_k S_k)^2 / (delta^2/z^2 + sum W_k S_k^2 / N)``.
    """
    if delta <= 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    W = weights(N)
    N = np.asarray(N, dtype=float)
    p = np.asarray(p_true, dtype=float)
    S = np.sqrt(p * (1 - p))
    z = z_value(confidence)
    ws = float(np.sum(W * S))
    if not fpc:
        return z * z * ws * ws / (delta * delta)
    return ws * ws / (delta * delta / (z * z) + float(np.sum(W * S * S)) / float(N.sum()))


def expected_jeffreys_variance(N, p_true, n, fpc: bool = False) -> np.ndarray:
    """``E[v]`` of `estimator.stratified_variance` with half-label-smoothed
    proportions, per stratum, when stratum ``k`` has ``n_k >= 2`` labels drawn
    from a stratum of true precision ``P_k``.

    With ``h`` the positives among the labels, the variance term is
    ``W^2 (1-f) (h+1/2)(n-h+1/2) / ((n-1)(n+1)^2)`` and
    ``E[(h+1/2)(n-h+1/2)] = n^2 P(1-P) - Var(h) + n/2 + 1/4``, with
    ``Var(h) = n P (1-P)`` drawn with replacement and ``n P (1-P)(N-n)/(N-1)``
    without (``fpc``, where also ``f = n/N``).  Returns one term per stratum.
    """
    W = weights(N)
    N = np.asarray(N, dtype=float)
    p = np.asarray(p_true, dtype=float)
    n = np.asarray(n, dtype=float)
    pq = p * (1.0 - p)
    if fpc:
        var_h = n * pq * (N - n) / np.maximum(N - 1.0, 1.0)
        keep = np.clip(1.0 - n / np.maximum(N, 1.0), 0.0, 1.0)
    else:
        var_h, keep = n * pq, 1.0
    mixed = n * n * pq - var_h + n / 2.0 + 0.25
    return W**2 * keep * mixed / ((n - 1.0) * (n + 1.0) ** 2)


def _labels_at_price(N, p, price, fpc: bool, cap) -> np.ndarray:
    """Per stratum, the ``n`` in ``[MIN_LABELS, cap]`` where one more label
    lowers the expected variance by ``price`` (``-dv/dn = price``).

    ``v_k(n)`` is convex and decreasing for ``n >= 2``, so the marginal gain
    falls with ``n`` and bisection on ``log n`` finds it.
    """
    lo = np.full(np.shape(p), np.log(MIN_LABELS))
    hi = np.log(cap)
    for _ in range(60):
        mid = (lo + hi) / 2.0
        n = np.exp(mid)
        eps = 1e-4 * n
        gain = (expected_jeffreys_variance(N, p, n - eps, fpc) - expected_jeffreys_variance(N, p, n + eps, fpc)) / (2 * eps)
        more = gain > price
        lo, hi = np.where(more, mid, lo), np.where(more, hi, mid)
    return np.exp((lo + hi) / 2.0)


def jeffreys_oracle_allocation(N, p_true, delta: float, confidence: float = 0.95, fpc: bool = False) -> np.ndarray:
    """Labels per stratum of the allocation that, knowing the true stratum
    precisions, brings the expected half-label-smoothed variance of the
    default interval to ``(delta/z)^2`` with the fewest labels (see the module
    docstring); 0 for an empty stratum.

    Minimising ``sum_k n_k`` subject to ``sum_k E[v_k(n_k)] <= (delta/z)^2``
    is separable and convex, so at the optimum every stratum above the
    two-label minimum has the same marginal gain ``-dE[v_k]/dn_k`` (the
    Lagrange condition behind Neyman's allocation; Cochran 1977, Sec. 5.5);
    the common gain is found by bisection.  Continuous (not rounded) counts,
    without the stopping rule's round granularity and variance margin, and
    with the normal width ``z sqrt(v)``, to which the Wilson interval with
    the design-effect sample size reduces at these label counts.  Unlike
    Neyman's, it is positive for pure strata: the interval cannot know they
    are pure without labels.
    """
    if delta <= 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    N = np.asarray(N, dtype=float)
    p = np.asarray(p_true, dtype=float)
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError("true stratum precisions must be in [0, 1]")
    live = N > 0
    out = np.zeros(N.shape)
    Nl, pl = N[live], p[live]
    if Nl.size == 0:
        raise ValueError("the population is empty: all stratum sizes are 0")
    target = (delta / z_value(confidence)) ** 2
    cap = np.maximum(Nl, MIN_LABELS) if fpc else np.full(pl.shape, 1e12)

    def variance_at(log_price):
        n = _labels_at_price(Nl, pl, np.exp(log_price), fpc, cap)
        return n, float(expected_jeffreys_variance(Nl, pl, n, fpc).sum())  # W from Nl: empty strata weigh 0

    n, v = variance_at(np.inf)  # every stratum at the two-label minimum
    if v > target:
        lo, hi = -80.0, 10.0  # log of the marginal gain per label
        for _ in range(70):
            mid = (lo + hi) / 2.0
            lo, hi = (mid, hi) if variance_at(mid)[1] <= target else (lo, mid)
        n, _ = variance_at(lo)
    out[live] = n
    return out


def jeffreys_oracle_labels(N, p_true, delta: float, confidence: float = 0.95, fpc: bool = False) -> float:
    """Total labels of `jeffreys_oracle_allocation`: the floor, in expectation,
    of every design that stops on the default interval."""
    return float(jeffreys_oracle_allocation(N, p_true, delta, confidence, fpc).sum())
