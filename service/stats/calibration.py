"""Mapping raw classifier scores to probabilities, for methods that need them.

Only ``opt_conf`` and ``opt_track`` use probabilities, and only as a prior for
the stratum standard deviations (Druck & McCallum 2011's pseudo-observations):
the estimator itself never trusts the scores.  The documented mapping:

* ``probability``: the score is already a probability (clipped to [0, 1]);
* ``logit``: the score is a logit or margin, mapped by the logistic function
  (Platt scaling with unit slope and zero offset);
* ``auto`` (default): ``probability`` if every score seen lies in [0, 1],
  otherwise ``logit``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import expit

from .sketch import BINS, ScoreHistogram, bin_edges_score

SCORE_KINDS: tuple[str, ...] = ("auto", "probability", "logit")


def resolve_kind(kind: str, lo: float, hi: float) -> str:
    """The concrete kind for `auto`, given the observed score range."""
    if kind not in SCORE_KINDS:
        raise ValueError(f"score kind must be one of {SCORE_KINDS}, got {kind!r}")
    if kind != "auto":
        return kind
    return "probability" if 0.0 <= lo and hi <= 1.0 else "logit"


def to_probability(scores, kind: str) -> np.ndarray:
    """Map scores of a concrete kind (`probability` or `logit`) to [0, 1]."""
    s = np.asarray(scores, dtype=float)
    if kind == "probability":
        return np.clip(s, 0.0, 1.0)
    if kind == "logit":
        return expit(s)
    raise ValueError(f"score kind must be 'probability' or 'logit', got {kind!r}")


def stratum_mean_probability(hist: ScoreHistogram, cuts: np.ndarray, kind: str = "auto") -> np.ndarray:
    """Mean calibrated probability per stratum, from the histogram's bucket
    midpoints (clipped to the observed range); 0.5 for an empty stratum."""
    concrete = resolve_kind(kind, hist.min, hist.max)
    edges = bin_edges_score()
    lower = np.clip(edges[:-1], hist.min, hist.max)
    upper = np.clip(edges[1:], hist.min, hist.max)
    mid = (lower + upper) / 2.0
    stratum = np.searchsorted(np.asarray(cuts, dtype=float), mid, side="right")
    k = len(cuts) + 1
    counts = hist.counts.astype(float)
    prob = to_probability(mid, concrete)
    mass = np.bincount(stratum, weights=counts, minlength=k)
    total = np.bincount(stratum, weights=counts * prob, minlength=k)
    assert stratum.size == BINS
    return np.where(mass > 0, total / np.where(mass > 0, mass, 1.0), 0.5)
