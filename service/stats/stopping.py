"""The stopping rule of Bennett & Carvalho (2010, Sec. 5 and Fig. 1).

Stop once the confidence interval's half-width is at most ``delta`` in ``T``
consecutive rounds (``T = 2`` by default, "to avoid a single spurious false
positive").  Pure and vectorised: the streak is an integer per run.
"""

from __future__ import annotations

import numpy as np

DEFAULT_ROUNDS = 2


def next_streak(streak, halfwidth, delta: float) -> np.ndarray:
    """Consecutive rounds meeting ``halfwidth <= delta`` after this round.

    A NaN half-width (no interval yet) breaks the streak.
    """
    if not delta > 0:
        raise ValueError(f"delta must be > 0, got {delta!r}")
    hw = np.asarray(halfwidth, dtype=float)
    met = np.isfinite(hw) & (hw <= delta)
    return np.where(met, np.asarray(streak) + 1, 0)


def should_stop(streak, rounds: int = DEFAULT_ROUNDS) -> np.ndarray:
    """True where the criterion has held for `rounds` consecutive rounds."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds!r}")
    return np.asarray(streak) >= rounds
