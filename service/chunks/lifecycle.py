"""A chunk's life in the request loop: which chunks are sampled, when a chunk has closed, how the
hourly label budget is paced, and the status the stopping rule gives a chunk.

Policy, not estimation: the sampling mathematics of a chunk whose population still arrives is
`stats.streams`, the intervals `stats.estimator` and `stats.confusion`.  Vectorised where the
stream simulation (`simulate.stream`) runs the very same rules over many runs at once.
"""

from __future__ import annotations

import numpy as np

#: Share of the hourly label budget available at the start of a clock hour;
#: the rest accrues evenly over the hour (`budget_allowance`).
BUDGET_BURST_SHARE = 0.1

#: A chunk's status (`chunk_status`; ``stopped`` is given by `final_status` to a chunk the loop no
#: longer samples).
STATUSES: tuple[str, ...] = ("open", "waiting_for_budget", "converged", "exhausted", "stopped")
#: The chunks the request loop samples whatever their status: the newest that has started, and the
#: one before it (still open for late records, or topping up its sample after closing).
ACTIVE_CHUNKS = 2
#: Statuses after which a closed chunk needs no more requests.
FINISHED = ("converged", "exhausted")


def sampled_chunks(chunks, chunk_seconds: float, now_s: float, retention: int = ACTIVE_CHUNKS) -> list:
    """The chunk ids (whole multiples of `chunk_seconds` since the epoch) the request loop may
    sample at `now_s`, oldest first: the `ACTIVE_CHUNKS` newest of those that have started, and
    before them every older started chunk whose reservoirs are still kept (the newest `retention`
    chunk ids, `CHUNK_RETENTION`).  The loop steps an older one until it is `FINISHED`: reviewers
    who answer, skip or let requests expire more slowly than a chunk lasts would otherwise leave
    every chunk below target, since its rounds go on after newer chunks have started."""
    ids = sorted(chunks)
    started = [t for t in ids if t * chunk_seconds <= now_s]
    kept = set(ids[-retention:]) if retention > 0 else set()
    return [t for t in started[:-ACTIVE_CHUNKS] if t in kept] + started[-ACTIVE_CHUNKS:]


def final_status(status: str, closed: bool, sampled: bool) -> str:
    """What a chunk's status means once the loop no longer samples it (not `sampled`: its
    reservoirs are gone, `sampled_chunks`): a closed chunk left ``open`` or ``waiting_for_budget``
    gets no more requests, so it is ``stopped`` (below target, its interval as wide as its labels
    make it; answers to its outstanding requests are still folded)."""
    if closed and not sampled and status not in FINISHED:
        return "stopped"
    return status


def counted_whole(chunk: int, chunk_seconds: float, missed_through_ms: int | None) -> bool:
    """Whether every record of `chunk` was counted in the state it is estimated from: the records
    that missed that state (the latest event time any of them can have, `missed_through_ms`;
    None: none did) all lie before the chunk's start.  Records miss a state in two ways: counted
    while the classifier's metrics needed no predicted negatives (``unpaired_through_ms``: the
    negatives' state misses them when recall, F1 or accuracy is enabled mid-chunk), or counted in
    a state Redis lost (``lost_through_ms``, `app.state_watch`).  A chunk some of whose records
    missed its state has no honest estimate from it: its totals would lack them."""
    return missed_through_ms is None or missed_through_ms < chunk * chunk_seconds * 1000


def is_closed(now_s, end_s, lateness_s: float) -> np.ndarray:
    """A chunk is closed once its end lies more than the allowed lateness in the past."""
    return np.asarray(now_s, dtype=float) >= np.asarray(end_s, dtype=float) + lateness_s


def budget_allowance(max_per_hour: int, seconds_into_hour) -> np.ndarray:
    """Label requests allowed so far in the current clock hour.

    A tenth of the hourly budget is there at the top of the hour, the rest
    accrues evenly, so a budget is never spent in the first minutes of the
    hour; whatever the hour did not use is gone when the next one starts.
    Rounded up, so the whole budget is there during the hour's last second.
    """
    s = np.clip(np.asarray(seconds_into_hour, dtype=float), 0.0, 3600.0)
    share = np.minimum(1.0, BUDGET_BURST_SHARE + (1.0 - BUDGET_BURST_SHARE) * s / 3600.0)
    return np.minimum(max_per_hour, np.ceil(max_per_hour * share - 1e-9)).astype(np.int64)


def allowance_at(max_per_hour: int, now_ms: int) -> int:
    """`budget_allowance` at wall-clock `now_ms`, in whole seconds into the clock hour: the one rule
    of the request loop, the review groups' GRANT and the API, so none disagrees with another by a label."""
    return int(budget_allowance(max_per_hour, (now_ms // 1000) % 3600))


def chunk_status(streak, halfwidth, delta: float, stop_rounds: int, closed, nothing_left, budget_blocked,
                 complete=True) -> np.ndarray:
    """``converged`` once the reported half-width is <= delta and has been for
    `stop_rounds` evaluations (Bennett & Carvalho's T-round rule), and for a closed
    chunk only once its sample is `complete`; else ``waiting_for_budget`` when
    requests wait for the hourly budget; ``exhausted`` when a closed chunk has
    nothing left to sample; else ``open``.

    `complete`: no request outstanding and no item at or below its stratum's
    threshold left unrequested.  Only then are the labelled items the whole
    threshold sample ``{u_i < tau_k}`` (module docstring); before, they lack the
    items requested last, which while items arrive are the latest arrivals, so a
    closed chunk's interval would lean towards the start of the chunk (an open
    chunk's interval is the items so far anyway, and its status may say
    ``converged`` between two arrivals)."""
    hw = np.asarray(halfwidth, dtype=float)
    closed = np.asarray(closed, dtype=bool)
    met = np.isfinite(hw) & (hw <= delta) & (np.asarray(streak) >= stop_rounds)
    met &= ~closed | np.asarray(complete, dtype=bool)
    out = np.where(np.asarray(budget_blocked, dtype=bool), "waiting_for_budget", "open")
    out = np.where(closed & np.asarray(nothing_left, dtype=bool), "exhausted", out)
    return np.where(met, "converged", out)


def chunk_closed(chunk: int, cfg, now_s: float) -> bool:
    """Whether chunk `chunk` (of ``cfg.chunk_seconds``) has closed at `now_s`: its end and
    ``cfg.allowed_lateness_seconds`` have passed, so no score can reach it any more."""
    return bool(is_closed(now_s, (chunk + 1) * cfg.chunk_seconds, cfg.allowed_lateness_seconds))


def closed_among(chunks: list[int], cfg, now_s: float) -> set[int]:
    """The chunks of `chunks` that have closed at `now_s` (`chunk_closed` of each, in one call)."""
    ids = np.asarray(chunks, dtype=np.int64)
    return set(ids[is_closed(now_s, (ids + 1) * cfg.chunk_seconds, cfg.allowed_lateness_seconds)].tolist())
