"""Score stratification: boundaries from a `ScoreHistogram`, and assignment.

K strata are contiguous score intervals (Bennett & Carvalho 2010, Sec. 5:
the true posterior is usually monotone in the score, so score intervals are
more homogeneous than the whole).  Stratum ``k`` holds scores in
``[cuts[k-1], cuts[k])``; stratum 0 holds the lowest scores.

Methods (Bennett & Carvalho 2010, Sec. 5; Kumar & Raj, Sec. 4.1):
* ``perc``       equal count (quantiles of the score);
* ``equal``      equal width between the observed min and max;
* ``cum_sqrt_f`` Dalenius & Hodges (1959): equal intervals of the cumulative
  square root of the frequency.  Applied to the equal-width classes of the
  histogram's squashed grid, following Cochran (1977, Sec. 5A.7), which asks
  for many more classes than strata (the grid has thousands).

When the scores cannot fill K strata (fewer distinct values than K, or all
mass in a few buckets) the duplicate or empty strata are merged and fewer
strata are returned: `boundaries` documents this and never returns an empty
stratum according to the histogram.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .sketch import ScoreHistogram, require_finite

Stratification = Literal["perc", "equal", "cum_sqrt_f"]
STRATIFICATIONS: tuple[str, ...] = ("perc", "equal", "cum_sqrt_f")


def _weighted_cuts(hist: ScoreHistogram, k: int, weights: np.ndarray) -> np.ndarray:
    """Scores at which the cumulative bucket weight crosses j/k, j=1..k-1."""
    lower, upper, _ = hist.occupied_edges()
    cum = np.concatenate([[0.0], np.cumsum(weights)])
    cum /= cum[-1]
    knots = np.concatenate([[lower[0]], upper])
    return np.interp(np.arange(1, k) / k, cum, knots)


def _mass_between(hist: ScoreHistogram, cuts: np.ndarray) -> np.ndarray:
    """Histogram count expected in each stratum defined by `cuts` (interpolated)."""
    lower, upper, counts = hist.occupied_edges()
    cum = np.concatenate([[0.0], np.cumsum(counts)])
    knots = np.concatenate([[lower[0]], upper])
    # np.interp needs increasing x; equal knots (a one-value bucket) are fine for
    # it but make the cdf a step there, which is what we want.
    at_cuts = np.interp(cuts, knots, cum)
    edges = np.concatenate([[0.0], at_cuts, [cum[-1]]])
    return np.diff(edges)


def boundaries(hist: ScoreHistogram, k: int, method: str = "perc") -> np.ndarray:
    """Interior cut points (increasing, length <= k-1) for `k` strata.

    Raises ValueError on an empty histogram, ``k < 1`` or an unknown method.
    Returns fewer than ``k-1`` cuts when the scores cannot fill ``k`` non-empty
    strata (see module docstring).
    """
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"strata must be a positive integer, got {k!r}")
    if method not in STRATIFICATIONS:
        raise ValueError(f"stratification must be one of {STRATIFICATIONS}, got {method!r}")
    if hist.total == 0:
        raise ValueError("the score histogram is empty: no scores to stratify")
    if k == 1 or hist.min == hist.max:
        return np.empty(0)
    _, _, counts = hist.occupied_edges()
    if method == "perc":
        cuts = _weighted_cuts(hist, k, counts)
    elif method == "equal":
        cuts = np.linspace(hist.min, hist.max, k + 1)[1:-1]
    else:
        cuts = _weighted_cuts(hist, k, np.sqrt(counts))
    cuts = np.unique(cuts)
    cuts = cuts[(cuts > hist.min) & (cuts <= hist.max)]
    # Merge strata the histogram says are empty (mass below half an item).
    while cuts.size:
        mass = _mass_between(hist, cuts)
        empty = np.flatnonzero(mass < 0.5)
        if empty.size == 0:
            break
        j = int(empty[0])
        cuts = np.delete(cuts, j if j < cuts.size else j - 1)
    return cuts


def assign(scores: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Stratum index of each score (0 = lowest), vectorised."""
    arr = require_finite(scores)
    return np.searchsorted(np.asarray(cuts, dtype=float), arr, side="right")


def stratify(scores: np.ndarray, k: int, method: str = "perc") -> tuple[np.ndarray, np.ndarray]:
    """Cut points and stratum of each score, through the same histogram the service uses."""
    arr = require_finite(scores)
    cuts = boundaries(ScoreHistogram.from_scores(arr), k, method)
    return cuts, assign(arr, cuts)
