"""A fleet classifier's hourly chunk (`fleet`): its truth in the service's strata, the labels it needs
alone, and one reading of its interval.

A precision classifier's chunk is its predicted positives, cut as `engine.prepare` cuts a built-in
precision population; its interval is Wilson's with the finite population correction
(`estimator.wilson_interval`).  A classifier whose metrics need its predicted negatives (recall, F1,
accuracy) has a chunk of every item it scored, cut on both sides of its threshold as
`whole.prepare_whole` cuts a built-in whole-stream population; its rounds are allocated on the
linearised variable of its metrics (`confusion.allocation_scale`) and its half-width is the widest
of its metrics' intervals (`confusion.metric_interval`), which its stopping rule reads as the
service's does.  The figures reported for it (estimate, interval, coverage) are its first metric's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..stats import allocation, confusion, estimator
from . import engine
from .fleet_spec import Member
from .populations import builtin
from .whole import WholeDesign, WholeTruth, prepare_whole, run_whole_until_stop
from .whole_populations import whole_builtin


@dataclass(frozen=True)
class ChunkTruth:
    """A classifier's hourly chunk in its strata (both sides' when `metrics` need the negatives)."""

    N: np.ndarray
    G: np.ndarray
    q: np.ndarray  # the allocation's prior: mean calibrated score per stratum
    positive: np.ndarray  # per stratum: on the predicted-positive side
    metrics: tuple[str, ...]
    truth: float  # the chunk's value of its first metric

    @property
    def precision_only(self) -> bool:
        return self.metrics == ("precision",)


@dataclass(frozen=True)
class Reading:
    """One reading of a classifier's chunk over runs: its first metric's interval, the widest
    half-width of its metrics (what its stopping rule reads), and each metric's variance (what the
    next round's allocation is scaled by)."""

    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    halfwidth: np.ndarray
    variances: tuple[np.ndarray, ...] = ()


def chunk_truth(member: Member) -> ChunkTruth:
    """`member`'s hourly chunk: its population's strata (the default design) with ``items_per_hour``
    items split as the population's, each stratum's positives at its rate."""
    metrics = tuple(member.metrics.split(","))
    if confusion.needs_negatives(metrics):
        st = prepare_whole(whole_builtin(member.population), WholeDesign(), metrics)
        positive = st.positive
    else:
        st = engine.prepare(builtin(member.population), engine.Design())
        positive = np.ones(st.N.size, bool)
    N = _scaled(st.N, member.items_per_hour)
    G = np.round(st.P * N).astype(np.int64)
    return ChunkTruth(N, G, st.q, positive, metrics, float(confusion.plug_in(metrics[0], N, N, G, positive)))


def _scaled(N: np.ndarray, items: int) -> np.ndarray:
    return allocation.largest_remainder(N.astype(float), items).astype(np.int64)


def need_alone(member: Member, truth: ChunkTruth, runs: int, seed, confidence: float) -> float:
    """Mean labels `member` needs to reach its delta alone, with no budget (without replacement, the
    service's rounds of two labels a stratum: `engine.run_until_stop`, `whole.run_whole_until_stop`)."""
    protocol = engine.Protocol(delta=member.delta, confidence=confidence, with_replacement=False)
    if truth.precision_only:
        st = engine.StrataTruth(np.zeros(0), truth.N, truth.G, truth.q, truth.truth)
        return float(np.mean(engine.run_until_stop(st, engine.Design(), protocol, runs, seed).labels))
    st = WholeTruth(truth.N, truth.G, truth.q, truth.positive)
    return float(np.mean(run_whole_until_stop(st, WholeDesign(), truth.metrics, protocol, runs, seed,
                                              int(truth.N.sum())).labels))


def read(truth: ChunkTruth, n: np.ndarray, h: np.ndarray, confidence: float) -> Reading:
    """The chunk's interval on the labels `n`, positives `h` (runs x strata), without replacement."""
    if truth.precision_only:
        iv = estimator.wilson_interval(truth.N, n, h, confidence, True)
        return Reading(iv.estimate, iv.lower, iv.upper, _finite(iv.halfwidth))
    ivs = [confusion.metric_interval(m, truth.N, n, h, truth.positive, confidence, True) for m in truth.metrics]
    widest = np.max([_finite(iv.halfwidth) for iv in ivs], axis=0)
    first = ivs[0]
    return Reading(first.estimate, first.lower, first.upper, widest, tuple(iv.stderr ** 2 for iv in ivs))


def _finite(halfwidth) -> np.ndarray:
    return np.where(np.isfinite(halfwidth), halfwidth, np.inf)


def allocate(truth: ChunkTruth, n: np.ndarray, h: np.ndarray, give: np.ndarray, last: Reading) -> np.ndarray:
    """The round of `give` labels per run over the chunk's strata, by the service's allocation
    (``opt_track``; on the linearised variable of its metrics when they need the negatives)."""
    scale = None
    if not truth.precision_only:
        variances = list(last.variances) or [np.full(n.shape[0], np.inf) for _ in truth.metrics]
        scale = confusion.allocation_scale(truth.metrics, truth.N, n, h, truth.positive, variances)
    return allocation.allocate_opt_track(truth.N, n, h, truth.q, give, with_replacement=False, scale=scale)
