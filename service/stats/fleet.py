"""One review budget shared by a group of classifiers: where the next labels go.

Each classifier of a group reports its chunk's state as a `Forecast`: the half-width of its widest
interval now, the labels it has, the items its chunk holds (its room: what it can still be asked), its
own ``delta`` and the operator's weight.  The group's labels for the next round go where they shrink
the largest weighted ratio ``r_c = w_c hw_c / delta_c`` (`share_budget`): the minimax form of the
multivariate "compromise" allocation (Kokan & Khan 1967, minimise the largest of several variances
subject to one cost), here over classifiers instead of strata.

The forecast of a classifier's half-width after ``x`` more labels is the one the request loop's
rounds use for a stratified sample with the finite population correction: the variance goes as
``1/m - 1/N`` in the labels ``m`` (Cochran 1977, eq. 5.6, with each classifier's own Neyman shares
inside), so ``hw(n + x) = hw(n) sqrt((1/(n+x) - 1/N) / (1/n - 1/N))``.  A classifier already within
its ``delta`` gets nothing, and none is given more than it needs to reach its ``delta`` nor more than
its room: the budget it cannot use goes to the others.

Everything is vectorised over leading axes (runs of a simulation), the classifiers on the last.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Bisection steps on the level: the level is found to 2^-60 of the largest ratio.
LEVEL_STEPS = 60


@dataclass(frozen=True)
class Forecast:
    """A group's classifiers (last axis) as the allocation sees them."""

    halfwidth: np.ndarray  # the widest enabled metric's half-width now (inf: no interval yet)
    labels: np.ndarray  # labels the chunk has
    items: np.ndarray  # items the chunk holds (inf while it grows without bound)
    delta: np.ndarray  # each classifier's own target half-width
    room: np.ndarray  # labels it can still be given (its reservoirs' unrequested items)
    weight: np.ndarray | float = 1.0

    def ratio(self) -> np.ndarray:
        """``w_c hw_c / delta_c``: the figure the group's allocation lowers, the largest first."""
        return np.asarray(self.weight, dtype=float) * np.asarray(self.halfwidth, dtype=float) / self.delta


def halfwidth_after(f: Forecast, extra) -> np.ndarray:
    """Each classifier's forecast half-width after `extra` more labels (module docstring)."""
    n = np.asarray(f.labels, dtype=float)
    inv_N = 1.0 / np.asarray(f.items, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = (1.0 / (n + extra) - inv_N) / (1.0 / n - inv_N)
    return np.asarray(f.halfwidth, dtype=float) * np.sqrt(np.clip(np.nan_to_num(scale, nan=1.0), 0.0, None))


def labels_to_halfwidth(f: Forecast, goal) -> np.ndarray:
    """More labels each classifier needs for its forecast half-width to reach `goal` (0 if it is
    there, inf if no number of labels gets there: the goal is at or below 0)."""
    n = np.asarray(f.labels, dtype=float)
    hw = np.asarray(f.halfwidth, dtype=float)
    inv_N = 1.0 / np.asarray(f.items, dtype=float)
    goal = np.asarray(goal, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        rho2 = (goal / hw) ** 2
        total = 1.0 / (inv_N + (1.0 / n - inv_N) * rho2)
    need = np.where(goal >= hw, 0.0, np.where(goal > 0, total - n, np.inf))
    return np.maximum(need, 0.0)


def _wanted(f: Forecast, level) -> np.ndarray:
    """Labels each classifier takes for its weighted ratio to reach `level` (never below its own
    ``delta``: ratio 1 unweighted), within its room."""
    w = np.asarray(f.weight, dtype=float)
    goal = np.maximum(np.asarray(level, dtype=float)[..., None] / w, 1.0) * f.delta
    want = np.minimum(labels_to_halfwidth(f, goal), np.asarray(f.room, dtype=float))
    return np.where(np.isfinite(f.halfwidth), want, 0.0)


def share_budget(f: Forecast, budget) -> np.ndarray:
    """The group's next `budget` labels per classifier (integers; last axis): the lowest level
    ``L`` such that bringing every classifier's weighted ratio down to ``max(L, w_c)`` takes at most
    the budget, found by bisection; rounded down, and the labels rounding left go one each to the
    classifiers with the largest ratio after the allocation that still have room.  A classifier with
    no interval yet (its pilot) is not served from the shared budget here: its own warm-up round is."""
    budget = np.asarray(budget, dtype=float)
    ratio = f.ratio()
    ratio = np.where(np.isfinite(ratio), ratio, 0.0)
    lo = np.zeros(np.shape(ratio)[:-1])
    hi = np.max(ratio, axis=-1, initial=0.0)
    for _ in range(LEVEL_STEPS):
        mid = 0.5 * (lo + hi)
        fits = _wanted(f, mid).sum(axis=-1) <= budget
        hi, lo = np.where(fits, mid, hi), np.where(fits, lo, mid)
    give = np.floor(_wanted(f, hi))
    return _spend_rest(f, give, budget)


def _spend_rest(f: Forecast, give: np.ndarray, budget) -> np.ndarray:
    """Labels left by rounding go one at a time to the classifier whose ratio is then largest and
    that still has room and is not within its delta (at most one per classifier: rounding left less
    than one each)."""
    left = np.floor(budget - give.sum(axis=-1)).astype(np.int64)
    hw = halfwidth_after(f, give)
    after = np.asarray(f.weight, dtype=float) * hw / f.delta
    open_ = (give < np.asarray(f.room, dtype=float)) & (hw > f.delta) & np.isfinite(after)
    order = np.argsort(np.where(open_, -after, np.inf), axis=-1)
    rank = np.argsort(order, axis=-1)
    extra = (rank < np.asarray(left)[..., None]) & open_
    return (give + extra).astype(np.int64)
