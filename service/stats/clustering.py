"""One-dimensional clustering of weighted points, for the KM and GMM stratifications (`strata`).

The points are the score histogram's bucket midpoints, the weights their counts, so both
fits cost a few thousand points whatever the stream's length, and the service can recompute
them per chunk from the mergeable histogram.  Deterministic: each starts from given clusters.
"""

from __future__ import annotations

import numpy as np

#: Iterations of Lloyd's algorithm at most (it usually converges in a few dozen).
MAX_ITERATIONS = 200
#: Iterations of EM at most: overlapping components (a mixture fitted to one bump) converge
#: slowly, in hundreds of iterations.
MAX_EM_ITERATIONS = 1000
#: EM runs on at most this many points (runs of adjacent buckets merged): its cost is points x
#: components x iterations, and a cut placed among 256 groups is as fine as strata need.
EM_POINTS = 256
#: EM stops once an iteration raises the log-likelihood by less than this share of it.
LIKELIHOOD_TOLERANCE = 1e-7
#: A component's variance never falls below this share of the points' variance: a component on
#: one tied score would otherwise collapse to a spike and take the mixture's likelihood to infinity.
VARIANCE_FLOOR_SHARE = 1e-4


def kmeans_1d(x: np.ndarray, w: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Lloyd's algorithm (Lloyd 1982) on increasing points `x` with weights `w`, from the
    clusters that the increasing `cuts` delimit.  In one dimension every cluster is an
    interval and the assignment step puts the cuts halfway between adjacent means.  Returns
    the increasing means of the non-empty clusters (a cluster left empty is dropped)."""
    x, w = np.asarray(x, dtype=float), np.asarray(w, dtype=float)
    cuts = np.unique(np.asarray(cuts, dtype=float))
    for _ in range(MAX_ITERATIONS):
        means = _interval_means(x, w, cuts)
        new = (means[1:] + means[:-1]) / 2.0
        if new.size == cuts.size and np.array_equal(new, cuts):
            break
        cuts = new
    return _interval_means(x, w, cuts)


def _interval_means(x: np.ndarray, w: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    label = np.searchsorted(cuts, x, side="right")
    mass = np.bincount(label, weights=w, minlength=cuts.size + 1)
    total = np.bincount(label, weights=w * x, minlength=cuts.size + 1)
    keep = mass > 0
    return total[keep] / mass[keep]


def gmm_1d_cuts(x: np.ndarray, w: np.ndarray, means: np.ndarray, lower: np.ndarray,
                fallback: np.ndarray) -> np.ndarray:
    """Cut points from a Gaussian mixture with one component per starting mean, fitted by EM
    (Dempster, Laird & Rubin 1977) to the weighted points, starting from the clusters of
    `kmeans_1d`.  With the components ordered by mean, the j-th cut is the lower edge
    (`lower`, one per point) of the first point more likely to come from a component above
    the j-th than from one at or below it; where no point is (a wide component swallows a
    narrow one, e.g. a lone outlier's), the j-th of the `fallback` (k-means) cuts.  Exactly
    ``len(means) - 1`` cuts, non-decreasing (`strata` merges equal ones)."""
    k = np.asarray(means).size
    if k < 2:
        return np.empty(0)
    x, w, lower = _coarsened(np.asarray(x, dtype=float), np.asarray(w, dtype=float), np.asarray(lower, dtype=float))
    post = _em(x, w, np.sort(np.asarray(means, dtype=float)))
    below = np.cumsum(post, axis=1)[:, :-1]  # P(component <= j | x), j = 0..k-2
    cuts = []
    for j in range(k - 1):
        above = np.flatnonzero(below[:, j] < 0.5)
        cuts.append(lower[above[0]] if above.size and above[0] > 0 else fallback[j])
    return np.maximum.accumulate(np.asarray(cuts, dtype=float))


def _coarsened(x: np.ndarray, w: np.ndarray, lower: np.ndarray):
    """At most `EM_POINTS` points: runs of adjacent points merged into their weighted mean, with
    the run's total weight and its first point's lower edge."""
    if x.size <= EM_POINTS:
        return x, w, lower
    starts = np.linspace(0, x.size, EM_POINTS + 1).astype(np.int64)[:-1]
    mass = np.add.reduceat(w, starts)
    return np.add.reduceat(w * x, starts) / mass, mass, lower[starts]


def _em(x: np.ndarray, w: np.ndarray, means: np.ndarray) -> np.ndarray:
    """Posterior component probabilities of each point (components sorted by mean at the end)."""
    total = w.sum()
    spread = np.sum(w * (x - np.sum(w * x) / total) ** 2) / total
    floor = max(VARIANCE_FLOOR_SHARE * spread, np.finfo(float).tiny)
    cuts = (means[1:] + means[:-1]) / 2.0
    resp = np.eye(means.size)[np.searchsorted(cuts, x, side="right")]  # k-means' hard clusters
    previous = -np.inf
    for _ in range(MAX_EM_ITERATIONS):
        mu, var, log_pi = _m_step(x, w, resp, floor, total)
        log_joint = log_pi - 0.5 * np.log(2 * np.pi * var) - (x[:, None] - mu) ** 2 / (2 * var)
        top = log_joint.max(axis=1, keepdims=True)
        log_norm = top[:, 0] + np.log(np.exp(log_joint - top).sum(axis=1))
        resp = np.exp(log_joint - log_norm[:, None])
        likelihood = float(np.sum(w * log_norm))
        if likelihood - previous <= LIKELIHOOD_TOLERANCE * abs(likelihood):
            break
        previous = likelihood
    return resp[:, np.argsort(mu, kind="stable")]


def _m_step(x: np.ndarray, w: np.ndarray, resp: np.ndarray, floor: float, total: float):
    """Means, variances (floored) and log weights of the components; an empty component keeps
    a negligible weight at the points' mean instead of dividing by zero."""
    mass = (w[:, None] * resp).sum(axis=0)
    safe = np.where(mass > 0, mass, 1.0)
    mu = np.where(mass > 0, (w[:, None] * resp * x[:, None]).sum(axis=0) / safe, np.sum(w * x) / total)
    var = np.maximum((w[:, None] * resp * (x[:, None] - mu) ** 2).sum(axis=0) / safe, floor)
    log_pi = np.log(np.maximum(mass / total, 1e-300))
    return mu, var, log_pi
