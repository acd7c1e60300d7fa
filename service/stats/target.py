"""What a chunk's design aims at: the enabled metrics over strata on both sides of the threshold
(`Target`), their intervals and the one the stopping rule reads (`confusion` holds the formulas)."""

from __future__ import annotations

import numpy as np

from .confusion import RATIO_METRICS, gradient, metric_interval, needs_negatives, parse_metrics, population
from .estimator import Interval


class Target:
    """What a chunk's design aims at: the enabled `metrics` over strata whose
    side (predicted positive or negative) is `positive`.

    ``Target.precision(k)`` (every stratum predicted positive, precision only)
    is today's design; `stats.streams` takes a Target wherever it sized
    labels by precision's weights ``W_k``, and uses instead the gradient of
    each metric (`gradient`), whose absolute value is ``W_k`` for precision.
    """

    def __init__(self, metrics, positive) -> None:
        self.metrics = parse_metrics(metrics)
        self.positive = np.asarray(positive, dtype=bool)
        if not needs_negatives(self.metrics) and not self.positive.all():
            raise ValueError("strata of predicted negatives need a metric that uses them (recall, f1, accuracy)")

    @classmethod
    def precision(cls, strata: int) -> "Target":
        return cls(("precision",), np.ones(strata, dtype=bool))

    @property
    def is_precision(self) -> bool:
        return self.metrics == ("precision",) and bool(self.positive.all())

    @property
    def has_ratio(self) -> bool:
        """Recall or F1 is enabled (`RATIO_METRICS`)."""
        return not RATIO_METRICS.isdisjoint(self.metrics)

    def intervals(self, N, n, h, confidence: float, fpc: bool) -> dict[str, Interval]:
        """Every enabled metric's interval (`metric_interval`)."""
        return {m: metric_interval(m, N, n, h, self.positive, confidence, fpc) for m in self.metrics}

    def widest(self, N, n, h, confidence: float, fpc: bool) -> Interval:
        """The interval with the largest half-width among the metrics that have a population
        (`population`; NaN if any of those is still unknown, or none has one): the one the
        stopping rule and the label forecasts look at."""
        ivs = self.intervals(N, n, h, confidence, fpc)
        if len(ivs) == 1:
            return next(iter(ivs.values()))
        hw = np.stack([np.where(population(m, N, self.positive) <= 0, -np.inf,
                                np.where(np.isnan(iv.halfwidth), np.inf, iv.halfwidth)) for m, iv in ivs.items()])
        pick = np.argmax(hw, axis=0)
        take = lambda field: np.choose(pick, [getattr(iv, field) for iv in ivs.values()])  # noqa: E731
        out = Interval(take("estimate"), take("lower"), take("upper"), take("stderr"))
        return out.undefined_where(~np.isfinite(np.max(hw, axis=0)))

    def weights(self, N, p) -> list[np.ndarray]:
        """Per metric, ``|dM/dp_k|`` at proportions `p` (``W_k`` for precision)."""
        return [np.abs(gradient(m, N, p, self.positive)) for m in self.metrics]
