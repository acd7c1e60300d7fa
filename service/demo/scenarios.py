"""Simulated classifiers for the demo and the ground truth per event-time chunk.

Every scenario draws, for a batch of predicted positives, their scores and the
probability that each is truly positive; the label is drawn from that
probability once, when the item is produced, and kept as the ground truth the
simulated reviewers answer from.  A scenario may change between chunks (its
argument is the chunk's ordinal since the demo started) but never inside a
chunk: each chunk's items are exchangeable, so a request issued early in a
chunk samples the same population as one issued late, and the true precision
of a chunk is a single well-defined number -- the mean label of its items.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable

import numpy as np
from scipy.special import expit

from ..stats.confusion import value

# (rng, n, chunk ordinal, ordinal at which the change happens) -> (scores, P(y=1 | item))
Draw = Callable[[np.random.Generator, int, int, int], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Scenario:
    classifier: str
    description: str
    informative: bool
    draw: Draw
    # the metrics the demo enables (STRATAMETER_METRICS); beyond precision, the scenario draws the
    # whole stream (predicted positive: score >= THRESHOLD) and the service samples both sides
    metrics: tuple[str, ...] = ("precision",)
    # scores per second, as a multiple of the demo's rate: a stream of rare positives must bring a
    # chunk the 25 x K predicted positives that give it strata (a provisional chunk is not sampled)
    rate_factor: int = 1

    @property
    def whole_stream(self) -> bool:
        return self.metrics != ("precision",)


def _steady(rng, n, k, switch):
    s = rng.uniform(0.5, 1.0, n)
    return s, expit(25.0 * (s - 0.58))  # the `steep` built-in population: precision ~0.83


def _degrading(rng, n, k, switch):
    s = 0.5 + 0.5 * rng.beta(4.0, 1.0, n)  # the score distribution never changes
    if k < switch:
        return s, expit(30.0 * (s - 0.8))  # precision ~0.84
    return s, expit(30.0 * (s - 0.9))  # a new kind of traffic fools it: precision ~0.6


def _shifting(rng, n, k, switch):
    # P(y|s) is fixed; the scores slide down (and, in a long run, back up) from chunk
    # to chunk, so the precision follows and the strata boundaries move every chunk.
    a = 3.6 + 2.4 * math.cos(math.pi * k / 2.0)
    s = 0.5 + 0.5 * rng.beta(a, 2.0, n)
    return s, expit(25.0 * (s - 0.7))


def _uninformative(rng, n, k, switch):
    s = rng.uniform(0.5, 1.0, n)
    return s, np.full(n, 0.6)


def _fraud_rare(rng, n, k, switch):
    # the whole stream: 5 % fraud; a logistic score of two Gaussian margins (fraud N(1.5, 1.2), the
    # rest N(-2.5, 1.2)), thresholded at 0.5 by the service: recall about 0.9, precision about 0.95
    y = rng.random(n) < 0.05
    z = np.where(y, rng.normal(1.5, 1.2, n), rng.normal(-2.5, 1.2, n))
    return expit(z), y.astype(float)


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("spam-steady", "steady, informative score (steep precision curve), precision ~0.83", True, _steady),
    Scenario("fraud-degrading", "same scores, precision drops from ~0.84 to ~0.55 halfway", True,
             _degrading),
    Scenario("toxicity-shifting", "fixed P(y|score), the scores slide from chunk to chunk", True,
             _shifting),
    Scenario("ads-uninformative", "no signal in the score (the control: strata cannot help)", False,
             _uninformative),
    Scenario("fraud-rare", "the whole stream, 5 % fraud: precision, recall, F1 from both sides",
             True, _fraud_rare, ("precision", "recall", "f1"), rate_factor=2),
)
#: The threshold of the whole-stream scenarios (the service's default STRATAMETER_THRESHOLD).
THRESHOLD = 0.5


def chunk_of(ms: int, chunk_seconds: int) -> int:
    """The service's chunk id of an event time (`stratameter.ingest.aggregate.chunk_of`)."""
    return int(ms) // (1000 * int(chunk_seconds))


class GroundTruth:
    """Every produced item's label (for the reviewers) and label tallies per (classifier, chunk).

    Item ids carry their chunk (``<classifier>-<chunk>-<seq>``), so labels of chunks
    the service can no longer request are dropped (`forget_before`) while the
    per-chunk tallies, two integers each, are kept for the whole run.
    """

    def __init__(self) -> None:
        self._labels: dict[int, dict[str, int]] = defaultdict(dict)
        # per (classifier, chunk): predicted positives, true positives among them, predicted
        # negatives, true positives among those (false negatives)
        self._tally: dict[tuple[str, int], list[int]] = defaultdict(lambda: [0, 0, 0, 0])
        self._seq = 0
        self.sent: dict[str, int] = defaultdict(int)
        self.last_chunk: dict[str, int] = {}

    def add(self, classifier: str, chunk: int, labels: np.ndarray, predicted: np.ndarray | None = None) -> list[str]:
        """Record a batch of one chunk (`predicted`: the decisions, default all positive); returns
        the new items' ids."""
        ids = [f"{classifier}-{chunk}-{self._seq + i}" for i in range(labels.size)]
        self._seq += labels.size
        store = self._labels[chunk]
        for item, y in zip(ids, labels.tolist()):
            store[item] = int(y)
        tally = self._tally[(classifier, chunk)]
        pred = np.ones(labels.size, dtype=bool) if predicted is None else np.asarray(predicted, dtype=bool)
        tally[0] += int(pred.sum())
        tally[1] += int(labels[pred].sum())
        tally[2] += int((~pred).sum())
        tally[3] += int(labels[~pred].sum())
        self.sent[classifier] += int(labels.size)
        self.last_chunk[classifier] = chunk
        return ids

    def label(self, item_id: str) -> int | None:
        try:
            chunk = int(item_id.rsplit("-", 2)[-2])
        except (ValueError, IndexError):
            return None
        return self._labels.get(chunk, {}).get(item_id)

    def forget_before(self, chunk: int) -> None:
        for t in [t for t in self._labels if t < chunk]:
            del self._labels[t]

    def items(self, classifier: str, chunk: int) -> int:
        tally = self._tally.get((classifier, chunk), (0, 0, 0, 0))
        return tally[0] + tally[2]

    def truth(self, classifier: str, chunk: int, metric: str = "precision") -> float | None:
        """The true value of `metric` over the chunk's items produced so far (None when undefined)."""
        pp, tp, pn, fn = self._tally.get((classifier, chunk), (0, 0, 0, 0))
        N = np.array([pp, pn], dtype=float)
        p = np.array([tp / pp if pp else 0.0, fn / pn if pn else 0.0])
        v = float(value(metric, N, p, np.array([True, False])))
        return v if math.isfinite(v) else None
