"""Score stratification: boundaries from a `ScoreHistogram`, and assignment.

K strata are contiguous score intervals (Bennett & Carvalho 2010, Sec. 5:
the true posterior is usually monotone in the score, so score intervals are
more homogeneous than the whole).  Stratum ``k`` holds scores in
``[cuts[k-1], cuts[k])``; stratum 0 holds the lowest scores.

Methods (Bennett & Carvalho 2010, Sec. 5; Kumar & Raj, Sec. 3.3 and 4.1):
* ``perc``       equal count (quantiles of the score; Kumar & Raj's EQSZ);
* ``equal``      equal width between the observed min and max (EQWD);
* ``cum_sqrt_f`` Dalenius & Hodges (1959): equal intervals of the cumulative
  square root of the frequency (SQRT).  Applied to the equal-width classes of
  the histogram's squashed grid, following Cochran (1977, Sec. 5A.7), which
  asks for many more classes than strata (the grid has thousands);
* ``cum_cbrt_f`` the same with the cube root (CBRT; Singh & Sukhatme 1969,
  for a stratification variable other than the estimated one);
* ``cum_sqrt_prior`` the Dalenius & Hodges rule with each class's frequency
  weighted by the prior variance ``pi (1 - pi)`` of its items' outcome, ``pi`` the
  score read as a probability (`calibration.to_probability`): equal intervals of
  the cumulative ``sqrt(f pi (1 - pi))``.  On the predicted negatives, where the
  missed positives are rare and gather just under the threshold, its strata are
  narrow there and wide far from it (issue 51; measured in
  docs/development/label-efficiency.md, the default there);
* ``wtmn``       Kumar & Raj's "weighted mean" rule, read literally: the
  stratum weight times the stratum mean of the stratification variable is the
  same in every stratum, i.e. equal stratum totals of the variable (the
  "equal aggregate" rule of Mahalanobis 1952 and Hansen, Hurwitz & Madow
  1953).  Scores may be negative (logits, margins), so the variable is the
  score measured from the observed minimum;
* ``kmeans``     1-D k-means (Lloyd 1982) on the bucket midpoints weighted by
  their counts, from the ``perc`` strata; cuts halfway between the sorted
  cluster means (KM);
* ``gmm``        a K-component Gaussian mixture fitted by EM (Dempster, Laird &
  Rubin 1977) on the same weighted midpoints, from the k-means solution; cuts
  where the most probable component changes (GMM).
The clustering fits live in `clustering`.

When the scores cannot fill K strata (fewer distinct values than K, or all
mass in a few buckets) the duplicate or empty strata are merged and fewer
strata are returned: `boundaries` documents this and never returns a stratum
that holds none of the scores the histogram was built from (a cut never splits
a bucket unless the strata on both sides are non-empty anyway).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from . import clustering
from .calibration import resolve_kind, to_probability
from .sketch import ScoreHistogram, require_finite

Stratification = Literal["perc", "equal", "cum_sqrt_f", "cum_cbrt_f", "cum_sqrt_prior", "wtmn", "kmeans", "gmm"]
STRATIFICATIONS: tuple[str, ...] = ("perc", "equal", "cum_sqrt_f", "cum_cbrt_f", "cum_sqrt_prior", "wtmn", "kmeans",
                                    "gmm")


def _weighted_cuts(hist: ScoreHistogram, k: int, weights: np.ndarray) -> np.ndarray:
    """Scores at which the cumulative bucket weight crosses j/k, j=1..k-1."""
    x, f = hist.cdf_knots(weights)
    return np.interp(np.arange(1, k) / k, f, x)


def _certain(hist: ScoreHistogram, cuts: np.ndarray) -> np.ndarray:
    """Per stratum: does the histogram prove it holds a score?  The lowest
    stratum holds the minimum and the highest the maximum (cuts lie in
    ``(min, max]``); any other stratum must hold a whole non-empty bucket."""
    lower, upper, _ = hist.occupied_edges()
    lo = np.searchsorted(cuts, lower, side="right")
    hi = np.searchsorted(cuts, upper, side="left")  # scores < upper ...
    hi[-1] = np.searchsorted(cuts, hist.max, side="right")  # ... but the top bucket holds max
    ok = np.bincount(lo[lo == hi], minlength=cuts.size + 1) > 0
    ok[0] = ok[-1] = True
    return ok


def _snap(hist: ScoreHistogram, cuts: np.ndarray, which: np.ndarray) -> np.ndarray:
    """Move the selected cuts that fall inside a non-empty bucket to the nearer
    edge of that bucket (above the top bucket's edge means: drop the cut)."""
    lower, upper, _ = hist.occupied_edges()
    i = np.clip(np.searchsorted(lower, cuts, side="left") - 1, 0, lower.size - 1)
    top = i == lower.size - 1
    inside = which & (cuts > lower[i]) & ((cuts < upper[i]) | (top & (cuts <= hist.max)))
    up = np.where(top, np.inf, upper[i])
    snapped = np.where(cuts - lower[i] <= upper[i] - cuts, lower[i], up)
    return np.where(inside, snapped, cuts)


def boundaries(hist: ScoreHistogram, k: int, method: str = "perc", score_kind: str = "auto") -> np.ndarray:
    """Interior cut points (increasing, length <= k-1) for `k` strata (`score_kind`: how
    ``cum_sqrt_prior`` reads a score as a probability, `calibration.SCORE_KINDS`).

    Raises ValueError on an empty histogram, ``k < 1`` or an unknown method.
    Returns fewer than ``k-1`` cuts when the scores cannot fill ``k`` non-empty
    strata (see module docstring); every stratum holds at least one of the
    scores the histogram was built from.
    """
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"strata must be a positive integer, got {k!r}")
    if method not in STRATIFICATIONS:
        raise ValueError(f"stratification must be one of {STRATIFICATIONS}, got {method!r}")
    if hist.total == 0:
        raise ValueError("the score histogram is empty: no scores to stratify")
    if k == 1 or hist.min == hist.max:
        return np.empty(0)
    cuts = _clean(hist, _raw_cuts(hist, k, method, score_kind))
    # Inside a bucket the histogram cannot say on which side of a cut the
    # bucket's scores lie (they may all be one tied value), so a stratum is
    # certainly non-empty only if it holds a whole non-empty bucket (or the
    # min or max).  Cuts bounding a stratum that is not certain are snapped to
    # bucket edges; a stratum still not certain is then empty and is merged
    # into its upper neighbour.
    bare = ~_certain(hist, cuts)
    if bare.any():
        cuts = _clean(hist, _snap(hist, cuts, bare[:-1] | bare[1:]))
        while cuts.size:
            empty = np.flatnonzero(~_certain(hist, cuts))
            if empty.size == 0:
                break
            cuts = np.delete(cuts, int(empty[0]))  # never the top stratum
    return cuts


def _raw_cuts(hist: ScoreHistogram, k: int, method: str, score_kind: str) -> np.ndarray:
    """The method's cut points before the emptiness checks of `boundaries`."""
    lower, upper, counts = hist.occupied_edges()
    if method == "perc":
        return _weighted_cuts(hist, k, counts)
    if method == "equal":
        return np.linspace(hist.min, hist.max, k + 1)[1:-1]
    if method == "cum_sqrt_f":
        return _weighted_cuts(hist, k, np.sqrt(counts))
    if method == "cum_cbrt_f":
        return _weighted_cuts(hist, k, np.cbrt(counts))
    if method == "cum_sqrt_prior":
        prior = to_probability(lower / 2.0 + upper / 2.0, resolve_kind(score_kind, hist.min, hist.max))
        # a tiny floor: buckets whose scores read as certain still order the cumulative weight
        return _weighted_cuts(hist, k, np.maximum(np.sqrt(counts * prior * (1.0 - prior)), 1e-300))
    # bucket midpoints as shares of the observed range: no overflow for scores near the largest doubles
    mid = _unit(lower / 2.0 + upper / 2.0, hist)
    if method == "wtmn":  # equal totals of (score - min)
        return _weighted_cuts(hist, k, counts * np.maximum(mid, 1e-12))
    means = clustering.kmeans_1d(mid, counts, _unit(_weighted_cuts(hist, k, counts), hist))
    kmeans_cuts = _from_unit((means[1:] + means[:-1]) / 2.0, hist)
    if method == "kmeans":
        return kmeans_cuts
    return clustering.gmm_1d_cuts(mid, counts, means, lower, kmeans_cuts)


def _unit(x: np.ndarray, hist: ScoreHistogram) -> np.ndarray:
    """`x` as a share of the observed range, from the minimum (finite even for scores near
    the largest doubles, whose difference overflows)."""
    half_range = hist.max / 2.0 - hist.min / 2.0
    return (x / 2.0 - hist.min / 2.0) / half_range


def _from_unit(u: np.ndarray, hist: ScoreHistogram) -> np.ndarray:
    return hist.min + 2.0 * (u * (hist.max / 2.0 - hist.min / 2.0))


def _clean(hist: ScoreHistogram, cuts: np.ndarray) -> np.ndarray:
    cuts = np.unique(cuts)
    return cuts[(cuts > hist.min) & (cuts <= hist.max)]


def assign(scores: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Stratum index of each score (0 = lowest), vectorised."""
    arr = require_finite(scores)
    return np.searchsorted(np.asarray(cuts, dtype=float), arr, side="right")


def stratify(scores: np.ndarray, k: int, method: str = "perc") -> tuple[np.ndarray, np.ndarray]:
    """Cut points and stratum of each score, through the same histogram the service uses."""
    arr = require_finite(scores)
    cuts = boundaries(ScoreHistogram.from_scores(arr), k, method)
    return cuts, assign(arr, cuts)
