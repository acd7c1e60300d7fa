"""Whole-stream populations: every item with its score and truth, and a decision threshold.

Recall, F1 and accuracy need the predicted negatives too, so these
populations hold the whole stream; ``predicted_positive`` is ``score >=
threshold`` (every item when the threshold is None: a multi-class model's
confidence in its predicted class, where "label" means the prediction was
right and only accuracy is defined).  Built-in populations are deterministic
(fixed seed) and as varied as real classifiers: rare positives (fraud,
prevalence 1 % and 2 %), moderation-like (10 %), balanced, raw two-sided SVM
margins, and a multi-class model's confidence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import expit

from ..stats.confusion import METRICS, value
from .populations import POPULATION_SIZE, Population, load


@dataclass(frozen=True)
class WholeStream:
    """A population of the whole stream with the classifier's threshold."""

    name: str
    scores: np.ndarray
    labels: np.ndarray  # int8, 1 = truly belongs to the positive class
    threshold: float | None
    description: str = ""

    @property
    def size(self) -> int:
        return int(self.labels.size)

    @property
    def predicted_positive(self) -> np.ndarray:
        if self.threshold is None:
            return np.ones(self.size, dtype=bool)
        return self.scores >= self.threshold

    @property
    def prevalence(self) -> float:
        return float(self.labels.mean())

    def metrics_defined(self) -> tuple[str, ...]:
        """Metrics with a value here: with no predicted negative only precision and accuracy
        (and for a multi-class confidence population, where every item is predicted
        positive, "truly positive" means "predicted right", so only accuracy is meaningful)."""
        if self.threshold is None:
            return ("accuracy",)
        return tuple(m for m in METRICS if np.isfinite(self.truth(m)))

    def truth(self, metric: str) -> float:
        """The population's value of `metric`."""
        pred = self.predicted_positive
        N = np.array([pred.sum(), (~pred).sum()], dtype=float)
        G = np.array([self.labels[pred].sum(), self.labels[~pred].sum()], dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            p = np.where(N > 0, G / np.maximum(N, 1.0), 0.0)
        return float(value(metric, N, p, np.array([True, False])))

    def srs_variance(self, metric: str, n: int) -> float:
        """The variance of `metric`'s plain estimate from a simple random sample of `n` items (with
        replacement), to first order: ``E[u^2] / n`` with ``u`` the metric's influence function
        (Wolter 2007, Ch. 6; Deville 1999): for precision ``pred (y - P) / E[pred]``, recall
        ``y (pred - R) / E[y]``, F1 ``(2 y pred - F (pred + y)) / (E[pred] + E[y])`` and accuracy
        ``right - A``, so recall's is ``R (1 - R) / (n prevalence)``: the ``p (1 - p) / n`` the
        budget tables divide by."""
        y = self.labels.astype(float)
        pred = self.predicted_positive.astype(float)
        m = self.truth(metric)
        if metric == "precision":
            u = pred * (y - m) / pred.mean()
        elif metric == "recall":
            u = y * (pred - m) / y.mean()
        elif metric == "f1":
            u = (2.0 * y * pred - m * (pred + y)) / (pred.mean() + y.mean())
        else:
            u = (y == pred) - m
        return float(np.mean(u * u) / n)

    def positives_only(self) -> Population:
        """The predicted positives as today's precision population."""
        pred = self.predicted_positive
        return Population(self.name, self.scores[pred], self.labels[pred], self.description, True)


def _two_class(prevalence: float, pos: tuple[float, float], neg: tuple[float, float], squash: bool):
    """Scores from a two-Gaussian latent margin: ``z | y ~ N(mean, sd)``; the
    probability ``expit(z)`` when `squash`, else the raw margin."""
    def make(rng: np.random.Generator, n: int):
        y = (rng.random(n) < prevalence).astype(np.int8)
        z = np.where(y == 1, rng.normal(*pos, n), rng.normal(*neg, n))
        return (expit(z) if squash else z), y
    return make


def _balanced(rng: np.random.Generator, n: int):
    s = rng.beta(0.7, 0.7, n)
    return s, (rng.random(n) < s).astype(np.int8)


def _multiclass_confidence(rng: np.random.Generator, n: int):
    c = 0.1 + 0.9 * rng.beta(3.0, 1.2, n)  # ten classes: confidence >= 1/10
    return c, (rng.random(n) < c**1.3).astype(np.int8)  # overconfident


#: name -> (generator, threshold, description)
WHOLE_BUILTIN: dict[str, tuple[Callable, float | None, str]] = {
    "fraud-rare": (_two_class(0.01, (1.5, 1.5), (-4.0, 1.3), True), 0.5,
                   "probabilities, rare positives (prevalence 1 %), fraud-like"),
    "abuse-rare-weak": (_two_class(0.02, (0.5, 1.5), (-3.0, 1.5), True), 0.5,
                        "probabilities, prevalence 2 %, a weak model (recall about 0.6)"),
    "moderation": (_two_class(0.10, (1.2, 1.4), (-2.5, 1.4), True), 0.5,
                   "probabilities, prevalence 10 %, moderation-like"),
    "balanced": (_balanced, 0.5, "probabilities, calibrated, prevalence 50 %"),
    "svm-two-sided": (_two_class(0.30, (1.0, 0.9), (-1.2, 0.9), False), 0.0,
                      "raw SVM margins on both sides of 0, prevalence 30 %"),
    "multiclass-confidence": (_multiclass_confidence, None,
                              "a 10-class model's confidence in its prediction; label = the prediction was right"),
}


def whole_builtin(name: str, size: int = POPULATION_SIZE, seed: int = 20110101) -> WholeStream:
    """A deterministic built-in whole-stream population (names in `WHOLE_BUILTIN`)."""
    if name not in WHOLE_BUILTIN:
        raise ValueError(f"unknown whole-stream population {name!r}; built-in: {', '.join(WHOLE_BUILTIN)}")
    make, threshold, description = WHOLE_BUILTIN[name]
    rng = np.random.default_rng([seed, list(WHOLE_BUILTIN).index(name)])
    scores, labels = make(rng, size)
    return WholeStream(name, np.asarray(scores, dtype=float), np.asarray(labels, dtype=np.int8), threshold,
                       description)


def whole_from_file(path, threshold: float) -> WholeStream:
    """Every ``score,label`` row of a CSV/JSONL file, predicted positive at ``score >= threshold``."""
    pop = load(path)
    whole = WholeStream(pop.name, pop.scores, pop.labels, float(threshold), pop.description)
    if not whole.predicted_positive.any():
        raise ValueError(f"--threshold {threshold} leaves no predicted positive in {path}")
    return whole
