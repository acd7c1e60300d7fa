"""What the stream loop (`stream.run_stream`) reads off the drawn items, vectorised over runs.

The service reads a chunk through Redis (its counts, its reservoir under the thresholds, its
histogram); the simulation's chunks are flat arrays of items laid out per run by (stratum,
priority) (`arrivals.Chunks`), so a threshold is a prefix of its stratum.  Here are the reads
the loop makes of that layout, each the vectorised twin of the service's own:

* `arrivals_by_step`: how many of a run's items have arrived by each step of the loop;
* `raised_thresholds`: `streams.threshold_after` for many (run, stratum) pairs at once;
* `chunk_calibration`: `labels.calibrated.chunk_calibration` for one run's chunk;
* `DeferredRounds`: the calibrated rounds of a flowing chunk, fitted only when they matter;
* `next_steps`: the loop's next step, per group of runs.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from ..stats import streams
from ..stats.calibration import resolve_kind
from ..stats.difference import Calibrated, Labelled, StratumGrid, calibrated_interval, feature
from ..stats.sketch import ScoreHistogram
from .arrivals import Chunks, StreamSettings


def next_steps(step: int, dt: float, S: int, active, ring_live, ptr, c: Chunks, first, last, N, waiting, end: float,
               silence: float, close_step: int, cap_step: int, group) -> np.ndarray:
    """Per group of runs, the next step at which one of its active runs' step can change anything:
    an answer lands (`ring_live`: per ring slot and group), an item arrives, a stream falls silent,
    the chunk closes, the time cap; every step while one of its chunks waits for the budget
    (`waiting`); never for a group with no active run.  A group's from its own runs alone."""
    G = ring_live.shape[1]
    never = np.iinfo(np.int64).max
    cand = np.full(G, min(cap_step, close_step) if step < close_step else cap_step, dtype=np.int64)
    landing = ring_live > 0
    if landing.any():
        ahead = np.where(landing, ((np.arange(S) - step - 1) % S)[:, None], S).min(axis=0)
        cand = np.where(ahead < S, np.minimum(cand, step + 1 + ahead), cand)
    coming = np.flatnonzero(active & (ptr < c.count))
    if coming.size:
        t_next = c.arr_key[coming * c.M + ptr[coming]] - c.arr_base[coming]
        np.minimum.at(cand, group[coming], np.ceil(t_next / dt - 1e-9).astype(np.int64))
    seen = np.flatnonzero(active & (ptr > 0))
    if seen.size:  # when `arrivals_flowing` turns false: the silence after the last arrival, or the end
        total = N[seen].sum(axis=1)
        gap = np.maximum(last[seen] - first[seen], 0.0) / np.maximum(total - 1.0, 1.0)
        flip = np.minimum(last[seen] + np.maximum(streams.SILENCE_GAPS * gap, silence), end)
        later = flip >= step * dt
        np.minimum.at(cand, group[seen[later]], np.floor(flip[later] / dt).astype(np.int64) + 1)
    nxt = np.where(np.bincount(group[active & waiting], minlength=G) > 0, step + 1, np.maximum(step + 1, cand))
    return np.where(np.bincount(group[active], minlength=G) > 0, nxt, never)


def arrivals_by_step(c: Chunks, dt: float, T: float, rows: int = 256) -> np.ndarray:
    """(runs, ceil(T / dt) + 2): per run, the items arrived by each step of ``dt`` seconds (an
    item arriving at ``a`` is counted from the first step with ``step * dt >= a``; every item
    arrives before the chunk's end ``T``).  `rows` runs at a time: a block's items are many."""
    R, M = c.runs, c.M
    n_arr = int(math.ceil(T / dt)) + 2
    out = np.empty((R, n_arr), dtype=np.int64)
    for lo in range(0, R, rows):
        part = slice(lo, min(R, lo + rows))
        a_sorted = c.arr_key.reshape(R, M)[part] - c.arr_base[part, None]
        first_step = np.ceil(a_sorted / dt).astype(np.int64)  # the first step with step * dt >= a
        first_step -= (first_step - 1) * dt >= a_sorted
        first_step += first_step * dt < a_sorted
        has = np.arange(M)[None, :] < c.count[part, None]
        at = np.arange(part.stop - lo)[:, None] * n_arr + np.minimum(first_step, n_arr - 1)
        out[part] = np.cumsum(np.bincount(at[has], minlength=(part.stop - lo) * n_arr).reshape(-1, n_arr), axis=1)
    return out


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


def chunk_calibration(c: Chunks, run: int, step: int, now: float, N, lands, fold, closed: bool,
                      s: StreamSettings, memo: dict | None = None) -> Calibrated:
    """`labels.calibrated.chunk_calibration` for one run's chunk at `step`: the labels landed
    by then, and the calibration's stratum means from the histogram of the scores arrived by
    `now` on the run's cuts (as the service reads its chunk's histogram).  `memo` keeps each run's
    last histogram's grid: a run's arrivals only grow, so the same number is the same items."""
    span = slice(run * c.M, (run + 1) * c.M)
    stratum = c.stratum[span]
    got = lands[span] <= step
    arrived = (c.a[span] <= now) & (stratum < c.K)
    count = int(np.count_nonzero(arrived))
    held = None if memo is None else memo.get(run)
    if held is None or held[0] != count:
        hist = ScoreHistogram.from_scores(c.score[span][arrived].astype(float))
        kind = resolve_kind("auto", hist.min, hist.max)
        held = (count, kind, StratumGrid.from_histogram(hist, c.cuts[run], kind))
        if memo is not None:
            memo[run] = held
    _, kind, grid = held
    items = Labelled(stratum[got], feature(c.score[span][got].astype(float), kind), c.y[span][got], fold[span][got])
    return calibrated_interval(N, items, grid, s.confidence, closed, s.calibration_min_labels, shown=False)


class DeferredRounds:
    """The rounds a chunk evaluates while its items still flow, with the calibration, fitted only
    when the chunk stops flowing, and only the last `rounds` of them.

    While items flow, a round's interval decides nothing but the stopping rule's streak: no round
    of labels is planned (`streams.plan_requests`), the chunk does not stop (it has not closed),
    and its status matters only against the hourly budget (so: no budget, and no per-step trace,
    with which every round is fitted as it comes).  Of the streak only ``min(streak, rounds)``
    ever matters (the rule compares it with `rounds`, and a round either adds one or resets it),
    and that depends on the last `rounds` rounds only: those, fitted newest first until one does
    not meet delta, give the same streak, and the newest the calibration the chunk holds."""

    def __init__(self, rounds: int, delta: float) -> None:
        self.rounds, self.delta = rounds, delta
        self.held: dict[int, tuple[int, int, deque]] = {}  # run -> (streak before, rounds held, the last ones)

    def __contains__(self, run: int) -> bool:
        return run in self.held

    def add(self, run: int, streak: int, step: int, now: float, N, halfwidth: float) -> None:
        """A round of `run` at `step` (`streak` before it; `N` its strata's sizes, `halfwidth` its
        plain interval's, which it reports unless the calibration is active)."""
        before, count, last = self.held.get(run, (streak, 0, deque(maxlen=self.rounds)))
        last.append((step, now, np.array(N), halfwidth))
        self.held[run] = (before, count + 1, last)

    def resolve(self, run: int, fit) -> tuple[int, Calibrated]:
        """The streak after `run`'s held rounds (``min(streak, rounds)`` where it reaches that) and
        the newest round's calibration; ``fit(step, now, N)`` is `chunk_calibration` at a round."""
        before, count, last = self.held.pop(run)
        newest = None
        for met, (step, now, N, halfwidth) in enumerate(reversed(last)):
            cal = fit(step, now, N)
            if newest is None:
                newest = cal
            hw = float(cal.interval.halfwidth) if cal.active else halfwidth
            if not (math.isfinite(hw) and hw <= self.delta):
                return met, newest
        return (before + count if count <= self.rounds else self.rounds), newest
