"""The chunks `stratameter simulate --stream` replays: how items arrive, what
they are, how reviewers answer.

A run's chunk is a fresh sample of a population arriving over
``[0, chunk_seconds)`` in one of the `SCENARIOS` (Poisson, one burst, batches,
a precision drop half-way, late answers).  Its strata come from the histogram
of its first `ingestor.provisional_cap` arrivals (the service's provisional
chunk), every item has a uniform priority (the reservoir key), and items are
laid out per run by (stratum, priority), so a threshold is a prefix of its
stratum (`Chunks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ingest.ingestor import provisional_cap
from ..stats import stopping
from ..stats.confusion import DEFAULT_NEGATIVE_STRATIFICATION, value
from ..stats.target import Target
from ..stats.calibration import resolve_kind, to_probability
from ..stats.sketch import ScoreHistogram
from ..stats.strata import boundaries

#: Reviewer delay of the "fast reviewer" (seconds, uniform).
FAST_REVIEW = (2.0, 10.0)


@dataclass(frozen=True)
class Scenario:
    """How a chunk's items arrive and how reviewers answer."""

    name: str
    description: str
    arrivals: str = "poisson"  # "poisson" (rate items/s), "burst" (all in the first second), "batches"
    batch_seconds: float = 20.0  # "batches": one batch every this many seconds
    drift: float = 0.0  # precision drop of the items arriving after `drift_after` of the chunk
    drift_after: float = 0.5  # the share of the chunk after which the drop applies (0: the whole chunk)
    review_delay: tuple[float, float] = FAST_REVIEW  # seconds, uniform
    skip_rate: float = 0.0


SCENARIOS: dict[str, Scenario] = {s.name: s for s in (
    Scenario("slow", "Poisson arrivals at the rate (default 1 item/s) over the whole chunk"),
    Scenario("burst", "all of the chunk's items (rate x chunk length) arrive in its first second", "burst"),
    Scenario("bursts", "a batch every 20 s (Poisson count, rate x 20 on average), each within one second",
             "batches"),
    Scenario("drift", "as slow, but the precision of the second half of the chunk is 0.2 lower "
             "(positives relabelled negative at random)", drift=0.2),
    Scenario("late-answers", "as slow, reviewers answer after 10-30 minutes", review_delay=(600.0, 1800.0)),
)}


@dataclass(frozen=True)
class StreamSettings:
    """The service settings the loop uses, and the simulation's own."""

    delta: float = 0.02
    confidence: float = 0.95
    chunk_seconds: float = 3600.0
    rate: float = 1.0  # items (predicted positives) per second
    lateness: float = 300.0  # ALLOWED_LATENESS_SECONDS
    max_labels_per_hour: int | None = None  # None: no budget
    label_timeout: float = 86400.0  # LABEL_TIMEOUT_SECONDS
    review_delay: tuple[float, float] | None = None  # None: the scenario's
    skip_rate: float | None = None  # None: the scenario's
    strata: int = 4
    stratification: str = "perc"
    labels_per_stratum: int = 2  # ROUND_LABELS_PER_STRATUM
    stop_rounds: int = stopping.DEFAULT_ROUNDS
    metric: str = "precision"  # recall, f1, accuracy: a whole-stream population, strata on both sides
    negative_strata: int = 4  # strata on the predicted negatives (recall, f1, accuracy)
    reservoir_size: int = 1024  # RESERVOIR_SIZE: provisional cap, and reported overflow (see `StreamResult`)
    step_seconds: float = 5.0  # the loop's step grid
    cap_seconds: float = 6 * 3600.0  # a run still sampling this long after its chunk closed is stopped
    calibration_min_labels: int = 0  # CALIBRATION_MIN_LABELS (precision); 0: today's estimator only


@dataclass
class Chunks:
    """The drawn chunks of R runs, items laid out per run by (stratum, priority).

    Flat arrays of length R * M (M = the largest chunk; a run's unused slots
    are padding in the pseudo-stratum K, arriving never).
    """

    runs: int
    M: int
    K: int
    key: np.ndarray  # 2 * (run * (K + 1) + stratum) + priority, increasing
    u: np.ndarray  # priority in (0, 1), multiples of 2^-32
    a: np.ndarray  # arrival time (inf for padding)
    y: np.ndarray  # int8 true label
    prob: np.ndarray  # calibrated score (to_probability)
    delay: np.ndarray  # reviewer delay, seconds
    skip: np.ndarray  # bool: the reviewer skips it
    stratum: np.ndarray  # int8, K = padding
    off: np.ndarray  # (R, K + 1) flat index of each stratum's first item
    size: np.ndarray  # (R, K) final N_k
    arr_key: np.ndarray  # (R * M,) run * span + arrival time, arrival order per run
    arr_li: np.ndarray  # (R * M,) layout index of the run's j-th arrival
    span: float
    count: np.ndarray  # (R,) items per run
    start: np.ndarray  # (R,) time the run's chunk gets its strata
    cuts: list  # per run, the boundaries (of the positive side)
    truth: np.ndarray  # (R,) realised value of the metric in the chunk (precision by default)
    positive: np.ndarray | None = None  # (K,) the side of each stratum; None: every stratum predicted positive
    metric: str = "precision"
    score: np.ndarray | None = None  # float32 score, kept only for the calibration (`calibration_min_labels`)
    # per run, what its own draw numbered it by (`concat`): ``arr_key - arr_base`` is its items' arrival
    # times, ``2 * (seg_base + k)`` its stratum k's key base (default: the run's index)
    arr_base: np.ndarray | None = None
    seg_base: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.arr_base is None:
            self.arr_base = np.arange(self.runs) * self.span
        if self.seg_base is None:
            self.seg_base = np.arange(self.runs) * (self.K + 1)

    def seg(self, runs, k) -> np.ndarray:
        return np.asarray(runs) * (self.K + 1) + np.asarray(k)

    def prefix(self, runs, k, tau) -> np.ndarray:
        """Per (run, stratum k), its items at or below the threshold `tau`: those with ``key <=
        2 seg + tau`` as its own draw's keys round that sum (`seg_base`), found in the keys of
        every run (their priorities are multiples of 2^-32: below the rounded threshold's
        multiple of 2^-32 exactly when below the threshold)."""
        own = (self.seg_base[runs] + k) * 2.0
        below = np.floor(((own + tau) - own) * 2.0**32) / 2.0**32
        return np.searchsorted(self.key, self.seg(runs, k) * 2.0 + below, side="right") - self.off[runs, k]

    @property
    def target(self) -> Target | None:
        """What the design aims at (`stats.streams`): None for precision (today's design)."""
        return None if self.positive is None else Target((self.metric,), self.positive)


def concat(chunks: list[Chunks], extra: list[np.ndarray] | None = None) -> tuple[Chunks, np.ndarray | None]:
    """Several draws' chunks as one, their runs one after another, each padded to the longest
    chunk (slots in the pseudo-stratum, arriving never); each run keeps the numbers its own draw
    gave it (`Chunks.arr_base`, `Chunks.seg_base`), so the loop computes the same for it.  `extra`:
    a per-item array of each draw (the calibration's folds), laid out alike."""
    K, M = chunks[0].K, max(c.M for c in chunks)
    runs = np.arange(sum(c.runs for c in chunks))

    def pad(arrays, fill=None) -> np.ndarray:  # (runs, M) per draw, then flat; fill None: a row's last value
        rows = [a.reshape(c.runs, c.M) for a, c in zip(arrays, chunks)]
        return np.concatenate([np.pad(r, ((0, 0), (0, M - r.shape[1])), mode="edge") if fill is None else
                               np.pad(r, ((0, 0), (0, M - r.shape[1])), constant_values=fill) for r in rows]).ravel()

    def own(c: Chunks, a: np.ndarray) -> np.ndarray:  # a layout index of `c`, within its run's slots
        return a.reshape(c.runs, -1) - (np.arange(c.runs) * c.M)[:, None]

    items = lambda name, fill: pad([getattr(c, name) for c in chunks], fill)  # noqa: E731
    runs_of = lambda name: np.concatenate([getattr(c, name) for c in chunks])  # noqa: E731
    stratum, u = items("stratum", K), items("u", 1.0 - 2.0**-33)
    arrival = np.concatenate([np.hstack([own(c, c.arr_li), np.broadcast_to(np.arange(c.M, M), (c.runs, M - c.M))])
                              for c in chunks])
    merged = Chunks(
        runs=runs.size, M=M, K=K, key=(runs.repeat(M) * (K + 1) + stratum) * 2.0 + u, u=u, a=items("a", np.inf),
        y=items("y", 0), prob=items("prob", 0.0), delay=items("delay", 0.0), skip=items("skip", False),
        stratum=stratum, off=np.concatenate([own(c, c.off) for c in chunks]) + (runs * M)[:, None],
        size=runs_of("size"), arr_key=pad([c.arr_key for c in chunks]), arr_li=(arrival + (runs * M)[:, None]).ravel(),
        span=chunks[0].span, count=runs_of("count"), start=runs_of("start"), cuts=[x for c in chunks for x in c.cuts],
        truth=runs_of("truth"), positive=chunks[0].positive, metric=chunks[0].metric,
        score=None if chunks[0].score is None else items("score", 0.0), arr_base=runs_of("arr_base"),
        seg_base=runs_of("seg_base"))
    return merged, None if extra is None else pad(extra, 0)


def arrival_times(scenario: Scenario, s: StreamSettings, runs: int, rng: np.random.Generator):
    """Arrival times per run, increasing, ``inf`` after the run's last item."""
    T, rate = float(s.chunk_seconds), float(s.rate)
    if scenario.arrivals == "poisson":  # given the count, the order statistics of uniforms (exponential spacings)
        count = np.maximum(rng.poisson(rate * T, runs), 1)  # a chunk with no item is no chunk
        M = max(int(count.max()), 1)
        spacing = np.cumsum(rng.standard_exponential((runs, M + 1)), axis=1)
        t = spacing[:, :M] / spacing[np.arange(runs), count][:, None] * T
    elif scenario.arrivals == "burst":
        count = np.full(runs, max(int(round(rate * T)), 1))
        M = int(count[0])
        t = np.sort(rng.random((runs, M)), axis=1) * min(1.0, T)
    elif scenario.arrivals == "batches":
        starts = np.arange(0.0, T, scenario.batch_seconds)
        per = rng.poisson(rate * scenario.batch_seconds, (runs, starts.size))
        per[per.sum(axis=1) == 0, 0] = 1  # a chunk with no item is no chunk
        count = per.sum(axis=1)
        M = max(int(count.max()), 1)
        t = np.full((runs, M), np.inf)
        row = np.repeat(np.arange(runs), count)
        col = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        within = np.minimum(1.0, np.diff(np.append(starts, T)))
        t[row, col] = np.repeat(np.tile(starts, runs), per.ravel()) + rng.random(row.size) * np.repeat(
            np.tile(within, runs), per.ravel())
        t = np.sort(t, axis=1)
    else:
        raise ValueError(f"unknown arrival pattern {scenario.arrivals!r}")
    t[np.arange(M)[None, :] >= count[:, None]] = np.inf
    return t, count.astype(np.int64), M


def draw(pop, scenario: Scenario, s: StreamSettings, runs: int, rng: np.random.Generator) -> Chunks:
    """R chunks: arrivals, a fresh sample of `pop`, strata, priorities, reviewer behaviour.

    `pop` is a `Population` of predicted positives, or for ``s.metric`` other
    than precision a `WholeStream`: then the items are the whole stream, the
    predicted positives get ``s.strata`` strata (ids 0..K-1) and the predicted
    negatives ``s.negative_strata`` after them, each side cut on its own first
    arrivals, and ``truth`` is the chunk's realised metric."""
    whole = s.metric != "precision"
    K = int(s.strata) + (int(s.negative_strata) if whole else 0)
    T = float(s.chunk_seconds)
    t, count, M = arrival_times(scenario, s, runs, rng)
    valid = np.isfinite(t)
    pick = rng.integers(0, pop.size, (runs, M))
    score = pop.scores[pick]
    y = pop.labels[pick].astype(np.int8)
    if whole and scenario.drift > 0:
        raise ValueError("the drift scenario lowers precision: it applies to --metric precision only")
    if scenario.drift > 0:
        if scenario.drift >= pop.truth:
            raise ValueError(f"a precision drop of {scenario.drift} needs a population precision above it, "
                             f"{pop.name} has {pop.truth:.3f}")
        late = valid & (t >= scenario.drift_after * T) & (y == 1)
        y[late & (rng.random((runs, M)) < scenario.drift / pop.truth)] = 0
    y[~valid] = 0
    kind = resolve_kind("auto", float(pop.scores.min()), float(pop.scores.max()))
    prob = to_probability(score, kind)
    if whole:
        pred = pop.predicted_positive[pick]
        truth = _realised(s.metric, y, pred, valid, s.strata)
        stratum, cuts, start = _whole_strata(score, pred, t, valid, count, s)
        positive = np.arange(K) < s.strata
    else:
        truth = y.sum(axis=1) / count
        stratum, cuts, start = _side_strata(score, t, valid, count, K, s.stratification, s.reservoir_size)
        stratum[~valid] = K
        positive = None
    priority = rng.integers(1, 2**32, (runs, M), dtype=np.uint32)
    u = priority / 2.0**32
    flat = _layout(stratum, priority)  # per run by (stratum, priority): flat indices into the (runs, M) arrays
    take = lambda x: x.ravel()[flat]  # noqa: E731
    # reviewer behaviour is independent of everything else: drawn in layout order
    lo, hi = s.review_delay or scenario.review_delay
    delay = (lo + (hi - lo) * rng.random(runs * M, dtype=np.float32))
    skip_rate = scenario.skip_rate if s.skip_rate is None else s.skip_rate
    skip = rng.random(runs * M, dtype=np.float32) < skip_rate
    lay_stratum = take(stratum)
    lay_u = take(u)
    key, seg_count, off, arr_li, arr_key, span = _keys(stratum, lay_stratum, lay_u, flat, t, valid, K, T)
    return Chunks(runs, M, K, key, lay_u, take(t), take(y), take(prob.astype(np.float32)), delay, skip,
                  lay_stratum, off, seg_count[:, :K].astype(np.int64), arr_key, arr_li, span, count, start, cuts,
                  truth, positive, s.metric, take(score.astype(np.float32)) if s.calibration_min_labels else None)


def _keys(stratum, lay_stratum, lay_u, flat, t, valid, K: int, T: float) -> tuple:
    """What `Chunks` indexes its laid-out items by: their keys, the strata's sizes and first items, the
    layout index of each arrival, the arrival keys and their span (built in place: a block's items are many)."""
    runs, M = stratum.shape
    key = lay_stratum.astype(np.float64)  # 2 * (run * (K + 1) + stratum) + priority
    key.reshape(runs, M)[:] += np.arange(runs)[:, None] * (K + 1)
    key *= 2.0
    key += lay_u
    seg_count = np.stack([np.count_nonzero(stratum == k, axis=1) for k in range(K + 1)], axis=1)
    off = np.arange(runs)[:, None] * M + np.cumsum(seg_count, axis=1) - seg_count
    arr_li = np.empty(runs * M, dtype=np.int64)
    arr_li[flat] = np.arange(runs * M)  # the layout index of each item, in arrival order
    span = 2.0 ** math.ceil(math.log2(T + 4.0))
    arr_key = np.where(valid, t, T + 2.0)
    arr_key += np.arange(runs)[:, None] * span
    return key, seg_count, off, arr_li, arr_key.ravel(), span


def _layout(stratum, priority) -> np.ndarray:
    """Per run (row), its items' order by (stratum, priority), ties in the order of arrival: the
    stable argsort of ``stratum * 2 + priority / 2^32``, as one sort of distinct integer keys
    (stratum, priority, column) where they fit in 64 bits; as flat indices into the (runs, M) arrays."""
    M = stratum.shape[1]
    column_bits = max(int(M - 1).bit_length(), 1)
    if int(stratum.max(initial=0)).bit_length() + 32 + column_bits > 64:
        return _flat(np.argsort(stratum * 2.0 + priority / 2.0**32, axis=1, kind="stable"))
    key = stratum.astype(np.uint64)  # in place from here: a block's items are many
    key <<= np.uint64(32)
    key |= priority
    key <<= np.uint64(column_bits)
    key |= np.arange(M, dtype=np.uint64)
    key.sort(axis=1)
    key &= np.uint64((1 << column_bits) - 1)
    return _flat(key.view(np.int64))


def _flat(order: np.ndarray) -> np.ndarray:
    """Per-row column indices as flat indices into the (rows, columns) arrays (in place)."""
    order += np.arange(order.shape[0])[:, None] * order.shape[1]
    return order.ravel()


def _side_strata(score, t, on_side, count, k: int, method: str, reservoir_size: int):
    """Per run, the strata of the items `on_side`: boundaries on the side's first
    arrivals (the service's opening histogram, `provisional_cap` of them).
    Returns the stratum of every item (0..k-1; meaningless off the side), the
    cuts per run, and when each run's side got its strata (inf: never)."""
    runs, M = score.shape
    cap = max(provisional_cap(k, reservoir_size), 1)
    cuts_pad = np.full((runs, max(k - 1, 0)), np.inf)
    cuts, start = [], np.full(runs, np.inf)
    for r in range(runs):
        idx = np.flatnonzero(on_side[r])
        if idx.size == 0:
            cuts.append(np.empty(0))
            continue
        first = idx[:cap]
        c = boundaries(ScoreHistogram.from_scores(score[r, first]), k, method)
        cuts.append(c)
        cuts_pad[r, :c.size] = c
        start[r] = t[r, first[-1]]
    stratum = np.zeros((runs, M), dtype=np.int8)
    for j in range(cuts_pad.shape[1]):
        stratum += score >= cuts_pad[:, j:j + 1]
    return stratum, cuts, start


def _whole_strata(score, pred, t, valid, count, s: StreamSettings):
    """Strata on both sides: positives 0..K-1, negatives K..K+K'-1; padding K+K'.
    A run's chunk has its strata once both sides have theirs (or once its
    last item has arrived, for a side that never fills its opening)."""
    k_pos, k_neg = int(s.strata), int(s.negative_strata)
    pos_k, cuts, pos_start = _side_strata(score, t, valid & pred, count, k_pos, s.stratification, s.reservoir_size)
    neg_k, _, neg_start = _side_strata(score, t, valid & ~pred, count, k_neg, DEFAULT_NEGATIVE_STRATIFICATION,
                                       s.reservoir_size)
    stratum = np.where(pred, pos_k, k_pos + neg_k).astype(np.int8)
    stratum[~valid] = k_pos + k_neg
    last = t[np.arange(t.shape[0]), count - 1]
    start = np.minimum(np.maximum(np.where(np.isfinite(pos_start), pos_start, 0.0),
                                  np.where(np.isfinite(neg_start), neg_start, 0.0)), last)
    return stratum, cuts, start


def _realised(metric: str, y, pred, valid, k_pos: int) -> np.ndarray:
    """Per run, the chunk's own value of `metric` (the truth its interval is judged by)."""
    N = np.stack([(valid & pred).sum(axis=1), (valid & ~pred).sum(axis=1)], axis=1).astype(float)
    G = np.stack([((y == 1) & valid & pred).sum(axis=1), ((y == 1) & valid & ~pred).sum(axis=1)], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = np.where(N > 0, G / np.maximum(N, 1.0), 0.0)
    return value(metric, N, p, np.array([True, False]))


def ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + length)`` for each pair."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths)
    return np.repeat(shift, lengths) + np.arange(total)
