"""`stratameter simulate --stream`: a chunk whose population arrives while it is sampled.

Each run replays a fresh sample of a population as the arrivals of one
event-time chunk ``[0, chunk_seconds)`` and runs the request loop of the
service on it, step by step, with the same pure functions
(`service.stats.streams`, `allocation`, `stopping`): threshold (sequential
Poisson) sampling, paced thresholds while items flow, online OPT rounds once
they stop, the T-round stopping rule, the paced hourly budget and the chunk's
interval (finite population correction only once the chunk has closed).

One loop step at wall time ``now`` (the chunk starts at 0, at the top of a
clock hour), for every run at once (arrays are (runs, strata)):

1. answers due by ``now`` arrive (reviewer delay, skips, the label timeout);
   the items that arrived by ``now`` are counted (N_k, and the exact mean of
   `calibration.to_probability` of their scores per stratum, the allocation's
   prior q_k; the service reads the same mean off the chunk's score
   histogram, to within a bucket);
2. ``closed``, ``flowing``, the forecast final size, the interval; a round is
   evaluated (`stopping.next_streak`) when nothing is pending and the label
   count has grown since the last evaluation; ``converged`` as the service's;
3. `streams.plan_requests`, then `streams.threshold_after` for the strata a
   round wants labels from;
4. every arrived, unrequested item at or below its stratum's threshold is
   requested, the lowest priority relative to its threshold first, as far as
   `streams.budget_allowance` minus this clock hour's requests allows.

A run's chunk gets its strata (`strata.boundaries` on the histogram of its
first `ingestor.provisional_cap` arrivals) when that many items have arrived;
until then the loop does not sample it (the service's provisional chunk),
and the items counted before are assigned with the same cuts.  A run stops
once its chunk is closed, nothing is pending and it has converged or has
nothing left to sample, or at the time cap (``cap_seconds`` after closing).

The engine is event driven on a grid of ``step_seconds``: answers land in a
ring buffer of future steps, each item is touched when it arrives, when a
threshold passes it and when it is requested, and steps where no run can
change (nothing flowing or pending) are skipped.  Items are laid out per run
by (stratum, priority), so a threshold is a prefix of its stratum.
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from ..ingest.ingestor import provisional_cap
from ..stats import allocation, stopping, streams
from ..stats.calibration import resolve_kind, to_probability
from ..stats.sketch import ScoreHistogram
from ..stats.strata import boundaries
from . import engine
from .populations import Population

#: Reviewer delay of the "fast reviewer" (seconds, uniform).
FAST_REVIEW = (2.0, 10.0)


@dataclass(frozen=True)
class Scenario:
    """How a chunk's items arrive and how reviewers answer."""

    name: str
    description: str
    arrivals: str = "poisson"  # "poisson" (rate items/s), "burst" (all in the first second), "batches"
    batch_seconds: float = 20.0  # "batches": one batch every this many seconds
    drift: float = 0.0  # precision drop of the items arriving in the chunk's second half
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
    reservoir_size: int = 1024  # RESERVOIR_SIZE: provisional cap, and reported overflow (see `StreamResult`)
    step_seconds: float = 5.0  # the loop's step grid
    cap_seconds: float = 6 * 3600.0  # a run still sampling this long after its chunk closed is stopped


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
    cuts: list  # per run, the boundaries
    truth: np.ndarray  # (R,) realised precision of the chunk

    def seg(self, runs, k) -> np.ndarray:
        return np.asarray(runs) * (self.K + 1) + np.asarray(k)


def _arrival_times(scenario: Scenario, s: StreamSettings, runs: int, rng: np.random.Generator):
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


def draw(pop: Population, scenario: Scenario, s: StreamSettings, runs: int, rng: np.random.Generator) -> Chunks:
    """R chunks: arrivals, a fresh sample of `pop`, strata, priorities, reviewer behaviour."""
    K = int(s.strata)
    T = float(s.chunk_seconds)
    t, count, M = _arrival_times(scenario, s, runs, rng)
    valid = np.isfinite(t)
    pick = rng.integers(0, pop.size, (runs, M))
    score = pop.scores[pick]
    y = pop.labels[pick].astype(np.int8)
    if scenario.drift > 0:
        if scenario.drift >= pop.truth:
            raise ValueError(f"a precision drop of {scenario.drift} needs a population precision above it, "
                             f"{pop.name} has {pop.truth:.3f}")
        late = valid & (t >= T / 2.0) & (y == 1)
        y[late & (rng.random((runs, M)) < scenario.drift / pop.truth)] = 0
    y[~valid] = 0
    truth = y.sum(axis=1) / count
    kind = resolve_kind("auto", float(pop.scores.min()), float(pop.scores.max()))
    prob = to_probability(score, kind)
    # strata of each run: boundaries on its first arrivals (the service's opening histogram)
    cap = max(provisional_cap(K, s.reservoir_size), 1)
    opening = np.minimum(count, cap)
    cuts_pad = np.full((runs, max(K - 1, 0)), np.inf)
    cuts = []
    for r in range(runs):
        c = boundaries(ScoreHistogram.from_scores(score[r, :opening[r]]), K, s.stratification)
        cuts.append(c)
        cuts_pad[r, :c.size] = c
    stratum = np.zeros((runs, M), dtype=np.int8)
    for j in range(cuts_pad.shape[1]):
        stratum += score >= cuts_pad[:, j:j + 1]
    stratum[~valid] = K
    start = t[np.arange(runs), opening - 1]
    u = rng.integers(1, 2**32, (runs, M), dtype=np.uint32) / 2.0**32
    # layout: per run by (stratum, priority)
    order = np.argsort(stratum * 2.0 + u, axis=1, kind="stable")
    take = lambda x: np.take_along_axis(x, order, axis=1).ravel()  # noqa: E731
    # reviewer behaviour is independent of everything else: drawn in layout order
    lo, hi = s.review_delay or scenario.review_delay
    delay = (lo + (hi - lo) * rng.random(runs * M, dtype=np.float32))
    skip_rate = scenario.skip_rate if s.skip_rate is None else s.skip_rate
    skip = rng.random(runs * M, dtype=np.float32) < skip_rate
    lay_stratum = take(stratum)
    lay_u = take(u)
    seg = np.repeat(np.arange(runs), M) * (K + 1) + lay_stratum
    key = seg * 2.0 + lay_u
    seg_count = np.bincount(seg, minlength=runs * (K + 1)).reshape(runs, K + 1)
    off = np.arange(runs)[:, None] * M + np.cumsum(seg_count, axis=1) - seg_count
    inv = np.empty_like(order)
    np.put_along_axis(inv, order, np.arange(M)[None, :].repeat(runs, 0), axis=1)
    arr_li = (np.arange(runs)[:, None] * M + inv).ravel()
    span = 2.0 ** math.ceil(math.log2(T + 4.0))
    arr_key = (np.arange(runs)[:, None] * span + np.where(valid, t, T + 2.0)).ravel()
    return Chunks(runs, M, K, key, lay_u, take(t), take(y), take(prob.astype(np.float32)), delay, skip,
                  lay_stratum, off, seg_count[:, :K].astype(np.int64), arr_key, arr_li, span, count, start, cuts,
                  truth)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(start, start + length)`` for each pair."""
    lengths = np.asarray(lengths, dtype=np.int64)
    total = int(lengths.sum())
    if total == 0:
        return np.empty(0, dtype=np.int64)
    shift = np.asarray(starts, dtype=np.int64) - (np.cumsum(lengths) - lengths)
    return np.repeat(shift, lengths) + np.arange(total)


def raised_thresholds(c: Chunks, runs, k, tau, m, want, now: float) -> np.ndarray:
    """`streams.threshold_after` for many (run, stratum) pairs at once.

    The free items above a threshold are the arrived items of the stratum
    past its prefix ``m`` (nothing above a threshold is ever requested), in
    priority order, so the raised threshold is the priority of the
    ``min(want, free)``-th arrived item after the prefix (unchanged if none).
    """
    runs, k, want = np.asarray(runs), np.asarray(k), np.asarray(want, dtype=np.int64)
    tau = np.array(tau, dtype=float)
    if runs.size == 0:
        return tau
    base = c.off[runs, k] + m
    avail = c.size[runs, k] - m
    width = int(min(max(int(avail.max()), 1), 2 * int(want.max()) + 16))
    cols = np.arange(width)
    inside = cols[None, :] < avail[:, None]
    idx = np.where(inside, base[:, None] + cols[None, :], 0)
    arrived = inside & (c.a[idx] <= now)
    cum = np.cumsum(arrived, axis=1)
    free_seen = cum[:, -1]
    found = free_seen >= want
    complete = found | (width >= avail)  # the window saw every free item or enough of them
    take = np.minimum(want, free_seen)
    j = np.argmax((cum >= take[:, None]) & arrived, axis=1)
    ok = complete & (take > 0)
    tau[ok] = np.maximum(tau[ok], c.u[idx[ok, j[ok]]])
    for i in np.flatnonzero(~complete):  # rare: many unarrived items above the threshold
        lo = base[i]
        seg = slice(lo, lo + avail[i])
        free = c.u[seg][c.a[seg] <= now]
        tau[i] = streams.threshold_after(tau[i], free, int(want[i]))
    return tau


@dataclass
class StreamResult:
    """Per run, at stop."""

    labels: np.ndarray  # answered labels
    requests: np.ndarray  # requests issued (answered, skipped, expired or pending)
    estimate: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    halfwidth: np.ndarray
    converged: np.ndarray  # bool
    closed: np.ndarray  # bool (every run stops closed)
    status: np.ndarray  # str, `streams.chunk_status` at stop
    capped: np.ndarray  # bool: stopped by the time cap
    stop_seconds: np.ndarray
    truth: np.ndarray
    items: np.ndarray  # chunk size
    reservoir_overflow: np.ndarray  # bool: a stratum's threshold sample exceeded RESERVOIR_SIZE
    budget_blocked_steps: np.ndarray  # steps in which requests waited for the budget
    tau: np.ndarray | None = None  # (runs, K) thresholds at stop
    n: np.ndarray | None = None  # (runs, K) labels at stop
    h: np.ndarray | None = None  # (runs, K) positive labels at stop
    N: np.ndarray | None = None  # (runs, K) final stratum sizes
    trace: list = field(default_factory=list)  # per step, for the traced runs
    chunks: Chunks | None = None  # with keep_items
    requested: np.ndarray | None = None  # with keep_items: per layout item
    requested_at: np.ndarray | None = None


def run_stream(pop: Population, scenario: Scenario, s: StreamSettings, runs: int, seed,
               trace_runs: int = 0, keep_items: bool = False) -> StreamResult:
    """R runs of the service's request loop on chunks drawn by `draw`.

    As in the service (`requests.loop`): a step is skipped where nothing the
    design looks at changed since the chunk's last step (items, labels,
    pending requests, flowing, closed, thresholds) unless the chunk waits for
    the budget; thresholds are stored only when a step issues requests (a
    raise that finds no arrived item is recomputed at the next step); the
    score prior is re-read when the chunk has grown by a tenth.
    """
    rng = np.random.default_rng(seed)
    c = draw(pop, scenario, s, runs, rng)
    R, K, M = runs, c.K, c.M
    dt = float(s.step_seconds)
    T = float(s.chunk_seconds)
    end, close_t = T, T + float(s.lateness)
    cap_t = close_t + float(s.cap_seconds)
    close_step, cap_step = math.ceil(close_t / dt - 1e-9), math.ceil(cap_t / dt - 1e-9)
    D = allocation.round_size(K, s.labels_per_stratum)
    timeout = float(s.label_timeout)
    resolve = np.minimum(c.delay.astype(np.float64), timeout)
    labelled = ~c.skip & (c.delay <= timeout)
    step_of = np.maximum(1, np.ceil(resolve / dt - 1e-9)).astype(np.int64)  # steps until the answer lands
    S = int(step_of.max()) + 1
    ring_n = np.zeros((S, R, K), dtype=np.int32)
    ring_h = np.zeros((S, R, K), dtype=np.int32)
    ring_c = np.zeros((S, R), dtype=np.int32)
    budget = s.max_labels_per_hour
    silence = streams.min_silence(T)

    N = np.zeros((R, K))
    qsum = np.zeros((R, K))
    q = np.full((R, K), 0.5)  # the prior, as last read
    q_size = np.zeros(R)  # chunk size when it was read
    n = np.zeros((R, K), dtype=np.int64)
    h = np.zeros((R, K), dtype=np.int64)
    req_k = np.zeros((R, K), dtype=np.int64)  # requested, per stratum
    pend = np.zeros(R, dtype=np.int64)
    tau = np.zeros((R, K))  # stored thresholds
    m = np.zeros((R, K), dtype=np.int64)  # items (arrived or not) at or below the stored thresholds
    streak = np.zeros(R, dtype=np.int64)
    evaluated = np.zeros(R, dtype=np.int64)
    status_now = np.full(R, "open", dtype=object)
    seen = np.full((R, 5 + K), np.nan)  # (items, labels, pending, flowing, closed, stored thresholds)
    ptr = np.zeros(R, dtype=np.int64)  # arrivals so far
    first = np.full(R, np.nan)
    last = np.full(R, np.nan)
    issued_hour = np.zeros(R, dtype=np.int64)
    issued_total = np.zeros(R, dtype=np.int64)
    overflow = np.zeros(R, dtype=bool)
    blocked_steps = np.zeros(R, dtype=np.int64)
    requested = np.zeros(c.key.size, dtype=bool)
    waiting = np.zeros(c.key.size, dtype=bool)  # arrived, unrequested, at or below the stored threshold
    n_waiting = np.zeros(R, dtype=np.int64)
    requested_at = np.full(c.key.size, np.nan, dtype=np.float32) if keep_items else None
    active = np.ones(R, dtype=bool)

    out = StreamResult(*(np.zeros(R, dtype=np.int64) for _ in range(2)), *(np.full(R, np.nan) for _ in range(4)),
                       np.zeros(R, bool), np.zeros(R, bool), np.full(R, "open", dtype=object), np.zeros(R, bool),
                       np.full(R, np.nan), c.truth, c.count, overflow, blocked_steps, np.zeros((R, K)),
                       np.zeros((R, K), dtype=np.int64), np.zeros((R, K), dtype=np.int64), np.zeros((R, K)))
    run_ids = np.arange(R)
    # arrivals so far at each step of the chunk (all items arrive before its end)
    n_arr = int(math.ceil(T / dt)) + 2
    a_sorted = c.arr_key.reshape(R, M) - run_ids[:, None] * c.span
    first_step = np.ceil(a_sorted / dt).astype(np.int64)  # the first step with step * dt >= a
    first_step -= (first_step - 1) * dt >= a_sorted
    first_step += first_step * dt < a_sorted
    has = np.arange(M)[None, :] < c.count[:, None]
    arrived_by = np.cumsum(np.bincount((run_ids[:, None] * n_arr + np.minimum(first_step, n_arr - 1))[has],
                                       minlength=R * n_arr).reshape(R, n_arr), axis=1).astype(np.int64)
    del a_sorted, first_step, has
    hour = -1
    step = 0
    while active.any():
        now = step * dt
        sl = step % S
        # 1. answers land
        n += ring_n[sl]
        h += ring_h[sl]
        pend -= ring_c[sl]
        ring_n[sl] = 0
        ring_h[sl] = 0
        ring_c[sl] = 0
        # arrivals: counted; those at or below a stored threshold are due
        new_ptr = arrived_by[:, min(step, n_arr - 1)]
        grew = np.flatnonzero(new_ptr > ptr)
        fresh = np.empty(0, dtype=np.int64)
        if grew.size:
            li = c.arr_li[_ranges(grew * M + ptr[grew], new_ptr[grew] - ptr[grew])]
            rr = li // M
            kk = c.stratum[li].astype(np.int64)
            flat = rr * K + kk
            N += np.bincount(flat, minlength=R * K).reshape(R, K)
            qsum += np.bincount(flat, weights=c.prob[li], minlength=R * K).reshape(R, K)
            first[grew] = np.where(np.isnan(first[grew]), c.arr_key[grew * M] - grew * c.span, first[grew])
            last[grew] = c.arr_key[grew * M + new_ptr[grew] - 1] - grew * c.span
            fresh = li[(li - c.off[rr, kk]) < m[rr, kk]]
            ptr = new_ptr
        closed = bool(streams.is_closed(now, end, s.lateness))
        capped = now >= cap_t
        if budget is not None and int(now // 3600) != hour:
            hour = int(now // 3600)
            issued_hour[:] = 0
        # 2. the loop, for the runs whose chunk has its strata and where something it looks at changed
        live = np.flatnonzero(active & (now >= c.start))
        total_l = N[live].sum(axis=1)
        flowing_l = streams.arrivals_flowing(total_l, first[live], last[live], now, end, T) & (not closed)
        key_l = np.column_stack([total_l, n[live].sum(axis=1), pend[live], flowing_l, np.full(live.size, closed),
                                 tau[live]])
        changed = (key_l != seen[live]).any(axis=1) | (status_now[live] == "waiting_for_budget") | capped
        rows = live[changed]
        flowing = flowing_l[changed]
        seen[rows] = key_l[changed]
        issued_now = np.zeros(R, dtype=np.int64)
        if rows.size:
            Nr, nr, hr = N[rows], n[rows], h[rows]
            total = total_l[changed]
            final = streams.expected_final_size(total, first[rows], last[rows], now, end, T)
            N_final = Nr * (final / total)[:, None]
            iv = streams.chunk_interval(Nr, nr, hr, s.confidence, closed)
            hw = iv.halfwidth
            labels = nr.sum(axis=1)
            ready = pend[rows] == 0
            ev = ready & (labels > evaluated[rows])
            st = streak[rows]
            st = np.where(ev, stopping.next_streak(st, hw, s.delta), st)
            streak[rows] = st
            evaluated[rows] = np.where(ev, labels, evaluated[rows])
            converged = np.isfinite(hw) & (hw <= s.delta) & (st >= s.stop_rounds)
            reread = (q_size[rows] == 0) | (total > 1.1 * q_size[rows])
            if reread.any():
                g = rows[reread]
                q[g] = np.where(N[g] > 0, qsum[g] / np.maximum(N[g], 1.0), 0.5)
                q_size[g] = total[reread]
            tau_r, want = streams.plan_requests(Nr, nr, hr, q[rows], tau[rows], N_final, flowing, ready, converged,
                                                s.delta, s.confidence, D, closed=closed)
            wr, wk = np.nonzero(want > 0)
            if wr.size:
                tau_r[wr, wk] = raised_thresholds(c, rows[wr], wk, tau_r[wr, wk], m[rows[wr], wk], want[wr, wk], now)
            tau_r = np.maximum(tau[rows], tau_r)
            m_r = m[rows].copy()
            cr, ck = np.nonzero(tau_r > tau[rows])
            if cr.size:
                g = rows[cr]
                m_r[cr, ck] = np.searchsorted(c.key, c.seg(g, ck) * 2.0 + tau_r[cr, ck], side="right") - c.off[g, ck]
            # due: waiting below the stored thresholds, fresh arrivals below them, arrived items the raise passes
            li = _ranges(c.off[rows[cr], ck] + m[rows[cr], ck], m_r[cr, ck] - m[rows[cr], ck])
            parts = [fresh, li[c.a[li] <= now]]
            if n_waiting[rows].any():
                in_rows = np.zeros(R, dtype=bool)
                in_rows[rows] = True
                held = np.flatnonzero(waiting)
                held = held[in_rows[held // M]]
                waiting[held] = False
                n_waiting[rows] = 0
                parts.append(held)
            due = np.concatenate(parts)
            due_run = due // M
            due_k = c.stratum[due].astype(np.int64)
            n_due = np.bincount(due_run, minlength=R)
            due_k_count = np.bincount(due_run * K + due_k, minlength=R * K).reshape(R, K)
            go = np.ones(due.size, dtype=bool)
            blocked = np.zeros(R, dtype=bool)
            if budget is not None:  # 3. the paced hourly allowance minus this clock hour's requests
                allowed = np.maximum(0, streams.budget_allowance(budget, now % 3600) - issued_hour)
                blocked = n_due > allowed
                if blocked.any():
                    where = np.full(R, -1, dtype=np.int64)
                    where[rows] = np.arange(rows.size)
                    rel = c.u[due] / np.maximum(tau_r[where[due_run], due_k], 1e-300)
                    o = np.lexsort((rel, due_run))  # per run, lowest priority relative to its threshold first
                    due, due_run, due_k = due[o], due_run[o], due_k[o]
                    rank = np.arange(due.size) - np.repeat(np.cumsum(n_due) - n_due, n_due)
                    go = rank < allowed[due_run]
                blocked_steps[blocked] += 1
            issue = due[go]
            # 4. request; the thresholds are stored with the requests
            if issue.size:
                ir = issue // M
                ik = c.stratum[issue].astype(np.int64)
                slot = (step + step_of[issue]) % S
                lab = labelled[issue]
                np.add.at(ring_n, (slot, ir, ik), lab)
                np.add.at(ring_h, (slot, ir, ik), lab & (c.y[issue] == 1))
                np.add.at(ring_c, (slot, ir), 1)
                cnt = np.bincount(ir, minlength=R)
                pend += cnt
                issued_now += cnt
                issued_hour += cnt
                issued_total += cnt
                req_k += np.bincount(ir * K + ik, minlength=R * K).reshape(R, K)
                requested[issue] = True
                if requested_at is not None:
                    requested_at[issue] = now
            stored = issued_now[rows] > 0
            g = rows[stored]
            tau[g], m[g] = tau_r[stored], m_r[stored]
            # due items not requested wait, if they lie below the (stored) thresholds
            rest = due[~go]
            if rest.size:
                rest_k = c.stratum[rest].astype(np.int64)
                rest = rest[(rest - c.off[rest // M, rest_k]) < m[rest // M, rest_k]]
                waiting[rest] = True
                n_waiting += np.bincount(rest // M, minlength=R)
            issued_k = np.bincount(issue // M * K + c.stratum[issue], minlength=R * K).reshape(R, K)
            unissued = (due_k_count - issued_k)[rows]  # due, left waiting
            overflow[rows] |= (req_k[rows] + unissued > s.reservoir_size).any(axis=1)
            # stop: closed, nothing pending, and converged or nothing left; or the time cap
            left = (N[rows] - req_k[rows] - unissued).sum(axis=1)  # arrived items above the thresholds
            nothing_left = (left == 0) & ready & (n_due[rows] == 0)
            finished = ready & (converged | nothing_left)
            done = closed & (finished | capped)
            status = streams.chunk_status(st, hw, s.delta, s.stop_rounds, closed, nothing_left, blocked[rows])
            status_now[rows] = status
            if trace_runs:
                for i in np.flatnonzero(rows < trace_runs):
                    r = rows[i]
                    out.trace.append({
                        "run": int(r), "t": now, "N": N[r].copy(), "n": n[r].copy(), "h": h[r].copy(),
                        "q": q[r].copy(), "pending": int(pend[r] - issued_now[r]), "tau": tau[r].copy(),
                        "tau_step": tau_r[i].copy(), "want": want[i].copy(), "flowing": bool(flowing[i]),
                        "closed": closed, "final": float(final[i]), "estimate": float(iv.estimate[i]),
                        "halfwidth": float(hw[i]), "streak": int(st[i]), "converged": bool(converged[i]),
                        "issued": int(issued_now[r]), "issued_hour": int(issued_hour[r]),
                        "waiting": int(n_waiting[r]), "status": str(status[i]), "requested": req_k[r].copy()})
            if done.any():
                d = rows[done]
                out.labels[d] = labels[done]
                out.requests[d] = issued_total[d]
                out.estimate[d], out.lower[d], out.upper[d] = iv.estimate[done], iv.lower[done], iv.upper[done]
                out.halfwidth[d] = hw[done]
                out.converged[d] = converged[done]
                out.closed[d] = closed
                out.status[d] = status[done]
                out.capped[d] = ~finished[done]
                out.stop_seconds[d] = now
                out.tau[d], out.n[d], out.h[d], out.N[d] = tau[d], n[d], h[d], N[d]
                active[d] = False
        step = _next_step(step, dt, S, active, ring_c, ptr, c, run_ids, first, last, N, status_now, end, silence,
                          close_step, cap_step)
    if keep_items:
        out.chunks, out.requested, out.requested_at = c, requested, requested_at
    return out


def _next_step(step, dt, S, active, ring_c, ptr, c, run_ids, first, last, N, status_now, end, silence,
               close_step, cap_step) -> int:
    """The next step at which some active run's step can change anything: an
    answer lands, an item arrives, a stream falls silent, the chunk closes, the
    time cap; every step while a chunk waits for the budget."""
    if not active.any():
        return step + 1
    if (status_now[active] == "waiting_for_budget").any():
        return step + 1
    cand = [cap_step] + ([close_step] if step < close_step else [])
    ahead = np.flatnonzero(ring_c[:, active].any(axis=1))
    if ahead.size:
        cand.append(step + 1 + int(((ahead - step - 1) % S).min()))
    coming = active & (ptr < c.count)
    if coming.any():
        t_next = c.arr_key[run_ids[coming] * c.M + ptr[coming]] - run_ids[coming] * c.span
        cand.append(int(math.ceil(float(t_next.min()) / dt - 1e-9)))
    seen_any = active & (ptr > 0)
    if seen_any.any():  # when `arrivals_flowing` turns false: the silence after the last arrival, or the end
        total = N[seen_any].sum(axis=1)
        gap = np.maximum(last[seen_any] - first[seen_any], 0.0) / np.maximum(total - 1.0, 1.0)
        quiet = last[seen_any] + np.maximum(streams.SILENCE_GAPS * gap, silence)
        flip = np.minimum(quiet, end)
        later = flip[flip >= step * dt]
        if later.size:
            cand.append(int(math.floor(float(later.min()) / dt)) + 1)
    return max(step + 1, min(cand))


@dataclass
class StreamSummary:
    scenario: str
    description: str
    runs: int
    labels_mean: float
    labels_se: float
    requests_mean: float
    reached_delta: float  # share of chunks converged at stop
    in_conf_reached: float | None  # |estimate - truth| <= delta among those
    coverage_closed: float  # every (closed) chunk's final interval vs its realised truth
    no_interval: float  # share of chunks with no interval at stop (counted as not covering)
    capped: float
    exhausted: float
    reservoir_overflow: float
    budget_blocked: float  # share of chunks that ever waited for the budget
    truth_mean: float
    items_mean: float
    stop_minutes_mean: float
    static_labels: float | None = None
    ratio_vs_static: float | None = None
    seconds: float = 0.0


def summarise(name: str, r: StreamResult, delta: float, runs: int, seconds: float) -> StreamSummary:
    ok = np.isfinite(r.lower) & np.isfinite(r.upper)
    cover = ok & (r.lower <= r.truth) & (r.truth <= r.upper)
    conv = r.converged
    inconf = np.abs(r.estimate - r.truth) <= delta
    lab = r.labels.astype(float)
    return StreamSummary(
        scenario=name, description=SCENARIOS[name].description if name in SCENARIOS else "", runs=runs,
        labels_mean=float(lab.mean()), labels_se=float(lab.std(ddof=1) / math.sqrt(lab.size)) if lab.size > 1 else 0.0,
        requests_mean=float(r.requests.mean()), reached_delta=float(conv.mean()),
        in_conf_reached=float(inconf[conv].mean()) if conv.any() else None,
        coverage_closed=float(cover[r.closed].mean()) if r.closed.any() else math.nan,
        no_interval=float((~ok).mean()), capped=float(r.capped.mean()),
        exhausted=float(np.mean(r.status == "exhausted")), reservoir_overflow=float(r.reservoir_overflow.mean()),
        budget_blocked=float(np.mean(r.budget_blocked_steps > 0)), truth_mean=float(r.truth.mean()),
        items_mean=float(r.items.mean()), stop_minutes_mean=float(np.mean(r.stop_seconds) / 60.0), seconds=seconds,
    )


def run_cell(pop: Population, scenario: str, s: StreamSettings, runs: int, seed) -> StreamSummary:
    t0 = time.perf_counter()
    r = run_stream(pop, SCENARIOS[scenario], s, runs, seed)
    return summarise(scenario, r, s.delta, runs, time.perf_counter() - t0)


@dataclass
class StaticSummary:
    """The fixed-population design (`stratameter simulate` without --stream) on the same population."""

    method: str
    stratification: str
    labels_mean: float
    labels_se: float
    in_conf: float
    runs: int


def run_static(pop: Population, delta: float, confidence: float, runs: int, seed) -> StaticSummary:
    design = engine.Design()
    st = engine.prepare(pop, design)
    r = engine.run_until_stop(st, design, engine.Protocol(delta=delta, confidence=confidence), runs, seed)
    return StaticSummary(design.method, design.stratification, float(r.labels.mean()),
                         float(r.labels.std(ddof=1) / math.sqrt(runs)),
                         float(np.mean(np.abs(r.estimate - pop.truth) <= delta)), runs)


@dataclass
class StreamStudy:
    population: Population
    scenarios: list[str]
    settings: StreamSettings
    runs: int
    seed: int


def _task(args):
    index, study, what = args
    s = study.settings
    if what is None:
        return index, run_static(study.population, s.delta, s.confidence, study.runs,
                                 np.random.SeedSequence([study.seed, 1000]))
    seed = np.random.SeedSequence([study.seed, list(SCENARIOS).index(what)])
    return index, run_cell(study.population, what, s, study.runs, seed)


def run_study(study: StreamStudy, progress: Callable[[int, int], None] | None = None,
              workers: int | None = None) -> tuple[StaticSummary, list[StreamSummary]]:
    """Every scenario, and the static design for comparison, in parallel processes.

    A scenario's runs depend only on the seed and the scenario (not on which
    other scenarios are run).
    """
    tasks = [(0, study, None)] + [(i + 1, study, name) for i, name in enumerate(study.scenarios)]
    results: list = [None] * len(tasks)
    workers = workers or min(len(tasks), os.cpu_count() or 1)
    done = 0
    if workers <= 1:
        for t in tasks:
            i, r = _task(t)
            results[i] = r
            done += 1
            if progress:
                progress(done, len(tasks))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for i, r in pool.map(_task, tasks):
                results[i] = r
                done += 1
                if progress:
                    progress(done, len(tasks))
    static, rows = results[0], results[1:]
    for row in rows:
        row.static_labels = static.labels_mean
        row.ratio_vs_static = row.labels_mean / static.labels_mean if static.labels_mean > 0 else None
    return static, rows


def as_json(study: StreamStudy, static: StaticSummary, rows: list[StreamSummary]) -> dict:
    """The machine-readable document of `stratameter simulate --stream --json`."""
    s = study.settings
    settings = {k: v for k, v in asdict(s).items() if k not in ("delta", "confidence")}
    return {
        "mode": "stream",
        "population": study.population.name,
        "size": study.population.size,
        "truth": study.population.truth,
        "delta": s.delta,
        "alpha": round(1.0 - s.confidence, 10),
        "confidence": s.confidence,
        "runs": study.runs,
        "seed": study.seed,
        "settings": settings,
        "static": asdict(static),
        "scenarios": [{k: _json_number(v) for k, v in asdict(r).items()} for r in rows],
    }


def _json_number(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
