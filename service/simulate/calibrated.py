"""`stratameter simulate --calibration`: what precision's difference estimator saves in the
service's design, paired against today's estimator on the same draws.

One run is the request loop on one closed chunk holding a whole population (K = 4 `perc`
strata, the allocation prior from the histogram, `streams.plan_requests` rounds, the stopping
rule `stopping.next_streak` with T rounds): items are drawn without replacement in a random
order per stratum, each label gets a fold (a fair coin, as the CRC-32 of a random request
id), and after every round the design evaluates its interval: today's
(`streams.chunk_interval`), or the one the service reports with the calibration
(`labels.calibrated`: `difference.calibrated_metrics`, with its switch), which also sizes
the catch-up and shortfall rounds by its variance ratio (`streams.plan_requests`).  The two
designs run on common random numbers (the same order of the items in each stratum, the same
fold per item), so the comparison is paired: the labels each needed and whether its interval
at its stop covered the truth.

The runs of a block step together (`designs`): each round's plain intervals and plans of every
design still running are one call of the statistics, which treat each row alone (the same
numbers as one design at a time); the calibration is fitted on each design's labelled items'
scores, one design at a time, and is most of a cell's time."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

import numpy as np

from ..stats import allocation, stopping, streams
from ..stats.calibration import resolve_kind, stratum_mean_probability
from ..stats.confusion import DEFAULT_NEGATIVE_STRATIFICATION
from ..stats.target import Target
from ..stats.difference import CALIBRATION_MIN_LABELS, Labelled, StratumGrid, calibrated_metrics, feature
from ..stats.sketch import ScoreHistogram
from ..stats.strata import assign, boundaries
from .parallel import map_in_processes
from .populations import Population
from .whole_populations import WholeStream

STRATA = 4
STOP_ROUNDS = 2
LABELS_PER_STRATUM = 2


@dataclass(frozen=True)
class Chunk:
    """A population as the service's closed chunk sees it."""

    N: np.ndarray
    stratum: np.ndarray  # per item
    x: np.ndarray  # calibration feature per item
    labels: np.ndarray
    members: list[np.ndarray]  # item indices per stratum
    grid: StratumGrid
    prior: np.ndarray
    truth: float
    metric: str = "precision"
    positive: np.ndarray | None = None  # per stratum, predicted positive; None: every one (precision's design)

    @property
    def target(self) -> Target | None:
        """The design's `target.Target` (None: precision's)."""
        return None if self.positive is None else Target((self.metric,), self.positive)

    @classmethod
    def of_whole(cls, pop: WholeStream, metric: str, strata: int = STRATA, negative_strata: int = STRATA) -> "Chunk":
        """The whole stream as one closed chunk with the service's strata on both sides (K `perc` on
        the predicted positives, K' `DEFAULT_NEGATIVE_STRATIFICATION` on the negatives, after them;
        an empty side has none), the calibration feature over the whole score range."""
        pred = pop.predicted_positive
        kind = resolve_kind("auto", float(pop.scores.min()), float(pop.scores.max()))
        stratum = np.empty(pop.size, dtype=np.int64)
        grids, priors, positive, first = [], [], [], 0
        for side, k, method in ((pred, strata, "perc"), (~pred, negative_strata, DEFAULT_NEGATIVE_STRATIFICATION)):
            if not side.any():
                continue
            hist = ScoreHistogram.from_scores(pop.scores[side])
            cuts = boundaries(hist, k, method)
            stratum[side] = first + assign(pop.scores[side], cuts)
            grids.append(StratumGrid.from_histogram(hist, cuts, kind))
            priors.append(stratum_mean_probability(hist, cuts, resolve_kind("auto", hist.min, hist.max)))
            positive.append(np.full(cuts.size + 1, side is pred))
            first += cuts.size + 1
        return cls(np.bincount(stratum, minlength=first).astype(float), stratum, feature(pop.scores, kind),
                   pop.labels.astype(np.int64), [np.flatnonzero(stratum == k) for k in range(first)],
                   StratumGrid.stack(grids), np.concatenate(priors), pop.truth(metric), metric, np.concatenate(positive))

    @classmethod
    def of(cls, pop: Population, strata: int = STRATA) -> "Chunk":
        hist = ScoreHistogram.from_scores(pop.scores)
        cuts = boundaries(hist, strata, "perc")
        stratum = assign(pop.scores, cuts)
        kind = resolve_kind("auto", hist.min, hist.max)
        return cls(np.bincount(stratum, minlength=strata).astype(float), stratum, feature(pop.scores, kind),
                   pop.labels.astype(np.int64), [np.flatnonzero(stratum == k) for k in range(strata)],
                   StratumGrid.from_histogram(hist, cuts, kind), stratum_mean_probability(hist, cuts, kind),
                   pop.truth)


@dataclass(frozen=True)
class Stop:
    labels: int
    estimate: float
    covered: bool
    active: bool  # the difference estimator's interval was the one reported at the stop
    converged: bool = True  # its half-width reached delta (a stream's chunk may stop exhausted or capped)


def run(chunk: Chunk, delta: float, confidence: float, rng: np.random.Generator,
        min_labels: int = CALIBRATION_MIN_LABELS, closed: bool = True) -> tuple[Stop, Stop]:
    """(today's stop, the calibrated stop) of one run: the two designs on common random numbers
    (the same order of the items in each stratum, the same fold for each item)."""
    return paired_runs(chunk, delta, confidence, rng, 1, min_labels, closed)[0]


def paired_runs(chunk: Chunk, delta: float, confidence: float, rng: np.random.Generator, count: int,
                min_labels: int = CALIBRATION_MIN_LABELS, closed: bool = True) -> list[tuple[Stop, Stop]]:
    """`count` runs (`run`, drawing from `rng` in the same order, run after run), their designs
    stepped together (`designs`)."""
    draws = [Draw.of(chunk, rng) for _ in range(count)]
    stops = designs(chunk, delta, confidence, [d for d in draws for _ in (0, 1)], [0, min_labels] * count, closed)
    return list(zip(stops[0::2], stops[1::2]))


#: Items of each stratum's order a run keeps (`Draw.of`): a design takes a few hundred labels.
ORDER_PREFIX = 1024


class Draw:
    """A run's common random numbers: per stratum, its items in the order the designs take them,
    and each of those items' fold.

    `of` keeps each order's first `ORDER_PREFIX` items and their folds (int32, int8): the same items
    and folds in a small share of the memory (the runs are drawn before they are stepped); a design
    that goes past a prefix draws the orders and folds again from the generator's state."""

    def __init__(self, order: list[np.ndarray], folds: np.ndarray, state=None) -> None:
        self.order, self.folds, self.state = order, [folds[o] for o in order], state

    @classmethod
    def of(cls, chunk: Chunk, rng: np.random.Generator) -> "Draw":
        state = (type(rng.bit_generator), rng.bit_generator.state)
        order = [rng.permutation(m)[:ORDER_PREFIX].astype(np.int32) for m in chunk.members]
        return cls(order, rng.integers(0, 2, chunk.stratum.size).astype(np.int8), state)

    def items(self, chunk: Chunk, k: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Stratum `k`'s items `start` to ``start + count`` in its order, and their folds."""
        if start + count > self.order[k].size and self.state is not None:
            kind, state = self.state
            rng = np.random.Generator(kind())
            rng.bit_generator.state = state
            order = [rng.permutation(m) for m in chunk.members]
            self.__init__(order, rng.integers(0, 2, chunk.stratum.size))
        return self.order[k][start:start + count], self.folds[k][start:start + count]


def design(chunk: Chunk, delta: float, confidence: float, order: list[np.ndarray], folds: np.ndarray,
           min_labels: int, closed: bool) -> Stop:
    """The request loop on the chunk until its stopping rule holds: rounds of
    `streams.plan_requests`, sized by the reported estimator's variance ratio, items taken in
    `order`; the difference estimator from `min_labels` labels (0: today's estimator only)."""
    return designs(chunk, delta, confidence, [Draw(order, folds)], [min_labels], closed)[0]


def designs(chunk: Chunk, delta: float, confidence: float, draws: list, min_labels: list[int],
            closed: bool) -> list[Stop]:
    """`design` for several `draws` and `min_labels` at once, each round's
    intervals and plans of every design still running in one call (the statistics treat each
    row alone: the same numbers as one design at a time); the calibrated intervals one by one."""
    D = len(draws)
    K = chunk.N.size
    n = np.zeros((D, K), dtype=np.int64)
    h = np.zeros((D, K), dtype=np.int64)
    drawn: list[list[tuple[np.ndarray, np.ndarray]]] = [[] for _ in range(D)]  # (items, their folds) per round
    streak = np.zeros(D, dtype=np.int64)
    stops: list[Stop | None] = [None] * D
    live = np.arange(D)
    round_labels = allocation.round_size(K, LABELS_PER_STRATUM)
    while live.size:
        ratio, scale, stopped = _evaluate(chunk, delta, confidence, draws, min_labels, closed, n, h, drawn, streak,
                                          stops, live)
        live, ratio = live[~stopped], ratio[~stopped]
        if not live.size:
            break
        scale = None if scale is None else scale[~stopped]
        _, want = streams.plan_requests(chunk.N, n[live], h[live], chunk.prior, np.zeros(K), chunk.N, False, True,
                                        False, delta, confidence, round_labels, closed=closed, target=chunk.target,
                                        variance_ratio=ratio, spread_scale=scale)
        want = np.minimum(np.asarray(want, dtype=np.int64), chunk.N.astype(np.int64) - n[live])
        done = want.sum(axis=1) == 0  # every item labelled: the figure is exact
        for r in live[done]:
            stops[r] = Stop(int(n[r].sum()), chunk.truth, True, False)
        for i, k in zip(*np.nonzero(want)):
            r = live[i]
            new, folds = draws[r].items(chunk, k, n[r, k], want[i, k])
            drawn[r].append((new, folds))
            h[r, k] += int(chunk.labels[new].sum())
            n[r, k] += new.size
        live = live[~done]
    return stops


def _evaluate(chunk: Chunk, delta: float, confidence: float, draws, min_labels, closed: bool, n, h, drawn, streak,
              stops, live) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """One round's evaluation of the `live` designs: each one's reported interval (today's, or
    the calibrated one from its `min_labels`), its streak and, where the stopping rule holds,
    its `Stop`.  Returns the variance ratio and spread scale each design's plan uses, and which
    stopped."""
    total = n[live].sum(axis=1)
    ratio = np.ones(live.size)
    scale = None
    hw, estimate, lower, upper = (np.full(live.size, np.nan) for _ in range(4))
    active = np.zeros(live.size, dtype=bool)
    calibrating = np.array([min_labels[r] > 0 and t >= min_labels[r] for r, t in zip(live, total)], dtype=bool)
    plain = (total > 0) & ~calibrating
    if plain.any():
        iv = streams.chunk_interval(chunk.N, n[live[plain]], h[live[plain]], confidence, closed, chunk.target)
        hw[plain], estimate[plain], lower[plain], upper[plain] = iv.halfwidth, iv.estimate_at_stop, iv.lower, iv.upper
    positive = np.ones(chunk.N.size, dtype=bool) if chunk.positive is None else chunk.positive
    for i in np.flatnonzero(calibrating):
        r = live[i]
        idx = np.concatenate([items for items, _ in drawn[r]])
        folds = np.concatenate([f for _, f in drawn[r]])
        c = calibrated_metrics(chunk.N, positive, Labelled(chunk.stratum[idx], chunk.x[idx], chunk.labels[idx],
                                                           folds), chunk.grid, (chunk.metric,),
                               confidence, closed, min_labels[r], shown=False)[chunk.metric]
        iv = c.interval
        hw[i], estimate[i], lower[i], upper[i] = iv.halfwidth, iv.estimate_at_stop, iv.lower, iv.upper
        active[i], ratio[i] = c.active, c.variance_ratio
        if c.allocation_scale is not None:
            scale = np.ones((live.size, chunk.N.size)) if scale is None else scale
            scale[i] = c.allocation_scale
    evaluated = total > 0
    streak[live[evaluated]] = stopping.next_streak(streak[live[evaluated]], hw[evaluated], delta)
    stopped = evaluated & (streak[live] >= STOP_ROUNDS)
    for i in np.flatnonzero(stopped):
        stops[live[i]] = Stop(int(total[i]), float(estimate[i]), bool(lower[i] <= chunk.truth <= upper[i]),
                              bool(active[i]))
    return ratio, scale, stopped


@dataclass(frozen=True)
class Cell:
    population: str
    delta: float
    runs: int
    labels_plain: float
    labels_calibrated: float
    saving: float  # 1 - calibrated / plain, mean labels
    saving_stderr: float  # of the paired difference, as a share of the plain mean
    coverage_plain: float
    coverage_calibrated: float
    active_at_stop: float
    bias_plain: float  # mean estimate at the stop minus the truth
    bias_calibrated: float
    reached_plain: float = 1.0  # share of runs whose half-width reached delta
    reached_calibrated: float = 1.0
    metric: str = "precision"

    @classmethod
    def of(cls, population: str, delta: float, pairs: list[tuple[Stop, Stop]], truth) -> "Cell":
        """The paired summary of `pairs` (today's stop, the calibrated stop), `truth` one value
        or one per run (a stream's chunk is judged by its own realised precision)."""
        runs = len(pairs)
        lp = np.array([p.labels for p, _ in pairs], dtype=float)
        lc = np.array([c.labels for _, c in pairs], dtype=float)
        diff = lp - lc
        truth = np.broadcast_to(np.asarray(truth, dtype=float), (runs,))
        mean = lambda stops, what: float(np.mean([getattr(x, what) for x in stops]))  # noqa: E731
        plain, calibrated = [p for p, _ in pairs], [c for _, c in pairs]
        return cls(population, delta, runs, float(lp.mean()), float(lc.mean()), float(diff.mean() / lp.mean()),
                   float(diff.std(ddof=1) / np.sqrt(runs) / lp.mean()) if runs > 1 else float("nan"),
                   mean(plain, "covered"), mean(calibrated, "covered"), mean(calibrated, "active"),
                   float(np.mean([x.estimate for x in plain] - truth)),
                   float(np.mean([x.estimate for x in calibrated] - truth)),
                   mean(plain, "converged"), mean(calibrated, "converged"))


#: Runs per block: each block has its own seed ([seed, block]), so results do not depend on `workers`.
BLOCK_RUNS = 50


def cell(pop: Population | WholeStream, delta: float, runs: int, confidence: float = 0.95, seed: int = 0,
         closed: bool = True, workers: int | None = None, metric: str = "precision") -> Cell:
    """`runs` paired runs (`run`) on `pop`, in blocks of `BLOCK_RUNS` spread over processes: for
    precision on a `Population` (or a `WholeStream`'s predicted positives, as the service samples
    them for precision alone), for another `metric` on a `WholeStream` (`Chunk.of_whole`)."""
    if isinstance(pop, WholeStream):
        chunk = Chunk.of(pop.positives_only()) if metric == "precision" else Chunk.of_whole(pop, metric)
    else:
        chunk = Chunk.of(pop)
    blocks = -(-runs // BLOCK_RUNS)
    parts = np.array_split(np.arange(blocks), min(blocks, workers or os.cpu_count() or 1))
    tasks = [(chunk, delta, confidence, [([seed, int(b)], min(BLOCK_RUNS, runs - int(b) * BLOCK_RUNS)) for b in part],
              closed) for part in parts]
    pairs = [pair for part in map_in_processes(_blocks, tasks, workers=workers) for pair in part]
    return dataclasses.replace(Cell.of(pop.name, delta, pairs, chunk.truth), metric=chunk.metric)


def _blocks(task) -> list[tuple[Stop, Stop]]:
    """A process's share of a cell's blocks, each drawn from its own seed, their designs stepped
    together (`designs`: each design's numbers are its own, whatever it is stepped with)."""
    chunk, delta, confidence, blocks, closed = task
    draws = [Draw.of(chunk, rng) for seed, count in blocks for rng in [np.random.default_rng(seed)]
             for _ in range(count)]
    stops = designs(chunk, delta, confidence, [d for d in draws for _ in (0, 1)],
                    [0, CALIBRATION_MIN_LABELS] * len(draws), closed)
    return list(zip(stops[0::2], stops[1::2]))
