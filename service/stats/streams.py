"""Sampling a chunk whose population is still arriving.

Bennett & Carvalho (2010) and Kumar & Raj sample a fixed population that is
known before the first label.  A chunk of a stream grows for its whole length,
so the service needs a rule under which *every* item of the final chunk, early
or late, has a known chance of being labelled:

**Threshold (sequential Poisson) sampling.**  Every item carries a uniform
random priority ``u_i`` (the reservoir's bottom-k key).  Stratum ``k`` has an
inclusion threshold ``tau_k`` that only ever rises; the sample is
``{i in stratum k : u_i < tau_k}``, whenever the item arrived: an item that
arrives later is requested as soon as it arrives below the threshold, and an
item that arrived earlier is requested from the reservoir when the threshold
rises past its priority (Ohlsson 1998, "Sequential Poisson sampling", J. Off.
Stat. 14:149; the same ordered-priority idea as Rosen's order sampling).
Given the number of labels ``n_k`` the labelled items are a simple random
sample of the stratum, so the stratified estimator and its variance
(`estimator`) apply unchanged; for a chunk that has closed the finite
population correction uses the chunk's final size, for an open chunk none
(the items still to come are not in the sample frame yet).

**Pacing.**  While items flow, each stratum's threshold is raised to
``PACE_SHARE * n*_k / N^_k``: ``n*_k`` is the Neyman allocation of the labels
the closed chunk's interval needs (`target_labels` with the finite population
correction of the expected final size) and ``N^_k`` the stratum's expected
final size (`expected_final_size`), so labels spread over the whole chunk
instead of being spent on its first minutes.  A threshold can never be
lowered, so the pace aims low (``PACE_SHARE``): an early target read off the
scores of a miscalibrated classifier would otherwise lock in too many labels,
while aiming low costs nothing, since every item stays in the reservoir to be
taken later.  Once arrivals have stopped or the chunk has closed, rounds top
the sample up from the reservoir, raising thresholds past the next-lowest
priorities: the first round takes each well-labelled stratum to
``CATCH_UP_SHARE`` of the closed chunk's target computed from its labels alone
(`catch_up`; the arrivals have stopped, so the items it holds are its final
ones and the target takes their finite population correction, as the pace's),
then the online OPT rounds of Bennett & Carvalho (allocation by ``opt_track``,
the T-round stopping rule) finish exactly as on a fixed population.  A chunk
whose items arrive in one burst therefore runs the fixed-population design as
soon as the burst is over.

Everything here is vectorised over runs (last axis: strata) so that
`stratameter simulate --stream` runs the very functions the service runs.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .allocation import MIN_LABELS_PER_STRATUM, allocate_opt_track, pseudo_smoothed, room_left
from .confusion import allocation_scale
from .estimator import STOPPING_VARIANCE_MARGIN, Interval, half_label_smoothed, interval, z_value
from .rows import on_rows
from .widths import ClosedWidths

#: Share of the Neyman target the pace aims at while items still arrive; the
#: rounds after the arrivals stop make up the rest (see the module docstring).
PACE_SHARE = 0.5
#: Share of the target the first round after the arrivals stop catches up to,
#: in the strata with at least `CATCH_UP_MIN_LABELS` labels (their spread then
#: comes from the labels, not from the scores).
CATCH_UP_SHARE = 0.97
CATCH_UP_MIN_LABELS = 30
#: For recall and F1, the catch-up also waits for this many labelled positives in the chunk: their
#: gradients come from the estimated recall, and targets read off a few positives overshoot
#: (`docs/decisions/catch-up-target.md`) ...
CATCH_UP_MIN_POSITIVES = 100
#: ... or for this share of the positives the chunk is estimated to hold, if that is fewer (a short
#: chunk may not hold 100 positives at all, and would then never be caught up).
CATCH_UP_POSITIVES_SHARE = 0.5
#: A stream is taken to have stopped for this chunk after a silence of this
#: many mean inter-arrival gaps (a Poisson stream is silent that long with
#: probability e^-20) ...
SILENCE_GAPS = 20.0
#: ... and at least this long (arrivals are seen batch by batch) ...
MIN_SILENCE_SECONDS = 30.0
#: ... but never more than this share of the chunk's length.
MIN_SILENCE_CHUNK_SHARE = 1.0 / 120.0
#: Share of the labels a closed chunk's half-width says are still missing that
#: one round takes (`shortfall_round`): answers that come after the chunk has
#: closed often come slowly (a review queue works through it), and each round
#: waits for its slowest answer, so rounds of 2K labels would take hours.
#: Half the estimated shortfall halves the gap per round without
#: overshooting on a noisy half-width.
SHORTFALL_SHARE = 0.5
#: ... but never more than this many times the labels the chunk already has: a round's allocation
#: rests on those labels, and a label given is never taken back (docs/decisions/shortfall-growth.md).
SHORTFALL_GROWTH = 8.0


def min_silence(chunk_seconds: float) -> float:
    """The shortest silence taken as the end of a chunk's arrivals."""
    return min(MIN_SILENCE_SECONDS, chunk_seconds * MIN_SILENCE_CHUNK_SHARE)


def arrivals_flowing(N, first_s, last_s, now_s, end_s, chunk_seconds: float) -> np.ndarray:
    """Whether more items are still expected in this chunk.

    No when its end has passed, or when the stream has been silent for
    ``max(SILENCE_GAPS mean gaps, min_silence)`` since the chunk's last
    arrival (``first_s``/``last_s``: wall-clock times of the first and last
    arrival in the chunk).
    """
    N = np.asarray(N, dtype=float)
    span = np.maximum(np.asarray(last_s, dtype=float) - np.asarray(first_s, dtype=float), 0.0)
    gap = span / np.maximum(N - 1.0, 1.0)
    silence = np.maximum(SILENCE_GAPS * gap, min_silence(chunk_seconds))
    now = np.asarray(now_s, dtype=float)
    return (now - np.asarray(last_s, dtype=float) <= silence) & (now < np.asarray(end_s, dtype=float)) & (N > 0)


def expected_final_size(N, first_s, last_s, now_s, end_s, chunk_seconds: float) -> np.ndarray:
    """Forecast of a chunk's final number of items, ``N + rate * time left``.

    ``rate`` is the chunk's mean arrival rate over its arrivals so far (over
    at least `min_silence`, so one batch does not read as an infinite rate),
    and no more items are expected once `arrivals_flowing` says the stream
    stopped or the chunk's end has passed.
    """
    N = np.asarray(N, dtype=float)
    span = np.maximum(np.asarray(last_s, dtype=float) - np.asarray(first_s, dtype=float), min_silence(chunk_seconds))
    rate = N / span
    left = np.maximum(np.asarray(end_s, dtype=float) - np.asarray(now_s, dtype=float), 0.0)
    flowing = arrivals_flowing(N, first_s, last_s, now_s, end_s, chunk_seconds)
    return N + np.where(flowing, rate * left, 0.0)


def target_labels(N, n, h, q, delta: float, confidence: float, fpc: bool = False, target=None) -> np.ndarray:
    """Labels per stratum the target half-width needs: Neyman's allocation
    ``n*_k = n* W_k S_k / sum_j W_j S_j`` with ``n* = (sum W S)^2 / (V + sum W S^2 / N)``,
    ``V = delta^2 / (z^2 margin)`` (Kumar & Raj, Eq. 9-10; the last term is the
    finite population correction for a population of ``N`` items, dropped
    without `fpc`), with the stopping margin of the default interval, ``S_k``
    from the labels plus Druck & McCallum's score pseudo-observations
    (`allocation.pseudo_smoothed`), and at least ``MIN_LABELS_PER_STRATUM`` in
    every non-empty stratum.

    For a `target.Target` other than precision, ``W_k`` is each metric's
    ``|dM/dp_k|`` (Neyman on the linearised variable; the finite population
    term is ``sum_k g_k^2 S_k^2 / N_k``), and a stratum needs the most any
    enabled metric asks of it.
    """
    N = np.asarray(N, dtype=float)
    p = pseudo_smoothed(n, h, q)
    S = np.sqrt(np.clip(p * (1.0 - p), 0.0, None))
    z = z_value(confidence)
    V = delta * delta / (z * z * STOPPING_VARIANCE_MARGIN)
    if target is None or target.is_precision:
        total = N.sum(axis=-1, keepdims=True)
        W = N / np.where(total > 0, total, 1.0)
        ws = np.sum(W * S, axis=-1, keepdims=True)
        if fpc:
            V = V + np.sum(W * S * S, axis=-1, keepdims=True) / np.where(total > 0, total, 1.0)
        need = ws * W * S / V
    else:
        need = np.zeros(np.broadcast_shapes(N.shape, S.shape))
        for g in target.weights(N, p):
            ws = np.sum(g * S, axis=-1, keepdims=True)
            fpc_term = np.sum(np.where(N > 0, g * g * S * S / np.maximum(N, 1.0), 0.0), axis=-1, keepdims=True)
            need = np.maximum(need, ws * g * S / (V + fpc_term if fpc else V))
    return np.where(N > 0, np.maximum(need, MIN_LABELS_PER_STRATUM), 0.0)


def paced_thresholds(tau, N_final, n_target) -> np.ndarray:
    """Raise each stratum's threshold to ``PACE_SHARE * n*_k / N^_k``; never lower it."""
    N_final = np.asarray(N_final, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        pace = np.where(N_final > 0, PACE_SHARE * np.asarray(n_target, dtype=float) / N_final, 0.0)
    return np.maximum(np.asarray(tau, dtype=float), np.clip(pace, 0.0, 1.0))


def chunk_interval(N, n, h, confidence: float, closed, target=None) -> Interval:
    """The reported interval: with the finite population correction only once the chunk is closed.

    With a `target.Target`, the widest of its metrics' intervals (the one
    the stopping rule and the label forecasts look at)."""
    def one(fpc: bool) -> Interval:
        if target is None or target.is_precision:
            return interval(N, n, h, confidence, "wilson", fpc=fpc)
        return target.widest(N, n, h, confidence, fpc)

    closed = np.asarray(closed, dtype=bool)
    if closed.ndim == 0:
        return one(bool(closed))
    with_fpc, without = one(True), one(False)
    pick = lambda a, b: np.where(closed, a, b)  # noqa: E731
    return Interval(*(pick(getattr(with_fpc, f), getattr(without, f))
                      for f in ("estimate", "lower", "upper", "stderr", "estimate_at_stop")))


def labels_to_reach(N, n, h, delta: float, confidence: float, p=None, passes: int = 4, grid: int = 32,
                    target=None) -> np.ndarray:
    """Labels at which a closed chunk's interval would be down to `delta` if
    every stratum's labels grew by the same factor, with proportions ``p``
    (default: the labels' own, ``h/n``): the smallest total of ``min(t n_k, N_k)`` whose interval
    (`chunk_interval`, closed: the finite population correction and the
    half-label guard at the larger counts) has a half-width <= delta, searched on
    ``t`` (the half-width falls as t grows).  The same interval as the stopping rule's, so a
    stratum whose labels all agree counts its guard shrinking as ``1/n``, not
    ``1/sqrt(n)``.  Today's labels where the interval is already narrow
    enough or has no width yet (fewer than two labels in a stratum).

    The search takes `passes` steps, each evaluating `grid` factors geometrically spaced in
    the bracket at once (one vectorised interval instead of one per bisection step): 4 x 32
    narrow the bracket by 2^20, as twenty bisections, in a sixth of their time (the request
    loop runs it twice per round of a closed chunk).  For precision the interval is evaluated
    by `ClosedWidths` (`chunk_interval`'s own functions, `wilson`, on all the factors at once,
    its per-stratum constants once per call, today's width with the first pass): 1.43 -> 0.51
    ms a call on steep's four strata, and `shortfall_round` (both forecasts in one search) 2.86
    -> 0.60 ms."""
    N = np.asarray(N, dtype=float)
    n = np.asarray(n, dtype=float)
    h = np.asarray(h, dtype=float)
    p = h / np.maximum(n, 1.0) if p is None else np.asarray(p, dtype=float)
    N, n, p = np.broadcast_arrays(N, n, p)
    return _search(N, n, p, delta, confidence, passes, grid, target)


def _search(N, n, p, delta: float, confidence: float, passes: int, grid: int, target) -> np.ndarray:
    """`labels_to_reach` on broadcast float arrays (any leading axes: `shortfall_round` stacks
    its two forecasts on one).  Today's half-width (``t = 1``) is evaluated with the first
    pass's factors, one interval fewer per call."""
    cap = np.maximum(N, n)
    grown = lambda t: np.minimum(n[..., None, :] * t[..., None], cap[..., None, :])  # noqa: E731
    if target is None or target.is_precision:
        width = ClosedWidths(N, n, p, cap, confidence)
    else:
        def width(t):  # t (..., G): the closed interval's half-width at each factor
            m = grown(t)
            full = lambda a: np.broadcast_to(a[..., None, :], m.shape)  # noqa: E731
            return chunk_interval(full(N), m, full(p) * m, confidence, True, target).halfwidth

    one = np.ones(N.shape[:-1] + (1,))
    now = None if passes > 0 and isinstance(width, ClosedWidths) else width(one)[..., 0]
    lo = np.ones(N.shape[:-1])
    with np.errstate(divide="ignore"):
        hi = np.maximum(np.max(np.where(n > 0, N / np.maximum(n, 1.0), 1.0), axis=-1), 1.0)
    steps = np.arange(1, grid + 1) / grid
    for _ in range(passes):
        cand = lo[..., None] * (hi / lo)[..., None] ** steps  # the last is hi
        if now is None:
            both = width(np.concatenate([one, cand], axis=-1))
            now, ok = both[..., 0], both[..., 1:] <= delta
        else:
            ok = width(cand) <= delta
        first = np.argmax(ok, axis=-1)  # the smallest factor that is enough (0 where none is)
        found = ok.any(axis=-1)
        below = np.take_along_axis(cand, np.maximum(first - 1, 0)[..., None], axis=-1)[..., 0]
        at = np.take_along_axis(cand, first[..., None], axis=-1)[..., 0]
        lo = np.where(found & (first > 0), below, np.where(found, lo, hi))
        hi = np.where(found, at, hi)
    short = np.isfinite(now) & (now > delta)
    return np.where(short, grown(hi[..., None])[..., 0, :].sum(axis=-1), n.sum(axis=-1))


def shortfall_round(D, N, n, h, q, delta: float, confidence: float, closed, target=None,
                    variance_ratio=1.0) -> np.ndarray:
    """Round size: ``D`` (Bennett & Carvalho's two labels per stratum), and once
    the chunk has `closed`, at least `SHORTFALL_SHARE` of the labels its
    interval says are missing (`labels_to_reach`), at most `SHORTFALL_GROWTH`
    times the labels it has (never below ``D``; not with recall or F1 enabled,
    see there).  The missing labels are
    the smaller of two forecasts: with the strata's proportions from their
    labels alone, and with the score prior's pseudo-observations
    (`allocation.pseudo_smoothed`).  Each errs one way: two labels that
    disagree in a stratum of precision 0.99 forecast a spread of 1/2 for its
    next hundred, and a miscalibrated score forecasts a spread the labels do
    not show; a forecast too low costs only another round.  `variance_ratio` scales
    the forecast: the reported estimator's variance over the plain one's at the
    same labels (`difference.Calibrated`; labels needed go as the variance).
    For precision both forecasts are searched at once (stacked on a leading axis).
    """
    closed = np.asarray(closed, dtype=bool)
    if not closed.any():
        return np.broadcast_to(np.asarray(D, dtype=np.int64), np.shape(n)[:-1]).copy()
    total = np.sum(n, axis=-1)
    if target is None or target.is_precision:
        N_, n_, h_ = (np.asarray(a, dtype=float) for a in (N, n, h))
        own, prior = h_ / np.maximum(n_, 1.0), pseudo_smoothed(n, h, q)
        N_, n_, own, prior = np.broadcast_arrays(N_, n_, own, prior)
        both = _search(np.stack([N_, N_]), np.stack([n_, n_]), np.stack([own, prior]), delta, confidence, 4, 32,
                       None)
        need = np.minimum(both[0], both[1])
    else:
        need = np.minimum(labels_to_reach(N, n, h, delta, confidence, target=target),
                          labels_to_reach(N, n, h, delta, confidence, pseudo_smoothed(n, h, q), target=target))
    missing = np.maximum(need * np.asarray(variance_ratio, dtype=float) - total, 0.0)
    share = np.ceil(SHORTFALL_SHARE * missing)
    if target is None or not target.has_ratio:
        share = np.minimum(share, np.floor(SHORTFALL_GROWTH * total))
    return np.where(closed, np.maximum(D, share), D).astype(np.int64)


def plan_requests(N, n, h, q, tau, N_final, flowing, round_ready, converged, delta: float, confidence: float,
                  round_labels: int, closed=False, target=None, variance_ratio=1.0,
                  spread_scale=None, capacity=None) -> tuple[np.ndarray, np.ndarray]:
    """One decision of the request loop for one chunk (or many runs at once).

    Returns ``(tau, want)``: the paced thresholds (while `flowing`) and the
    extra labels per stratum of a round where the arrivals have stopped, the
    previous round is complete (`round_ready`: nothing pending) and the chunk
    has not `converged`: an online OPT round (``opt_track``, `round_labels`
    labels, or once the chunk has `closed` a share of what its interval says
    is missing: `shortfall_round`), or more where a stratum with
    `CATCH_UP_MIN_LABELS` labels is short of `CATCH_UP_SHARE` of its target
    (`catch_up`).  A `target.Target` other than precision sizes and
    allocates for its metrics (`confusion.allocation_scale`).  The caller turns
    ``want`` into higher thresholds by taking the next-lowest priorities of
    each stratum (`threshold_after`).  `variance_ratio` (below 1 where the difference
    estimator is reported, `difference.Calibrated`) scales the labels the
    catch-up and shortfall rounds forecast, and `spread_scale` (per stratum,
    `difference.Calibrated.allocation_scale`) makes the rounds allocate on the
    residual spread (for another target, times its metrics' scale).
    `capacity` (per stratum, default its items) is the most labels a stratum
    can take: the service's reservoir keeps ``RESERVOIR_SIZE`` items a stratum,
    so a round's labels that a full reservoir cannot give go to the strata that
    can (`allocation._cap`), and a chunk stops asking where nothing is left.
    """
    flowing = np.asarray(flowing, dtype=bool)
    do_round = ~flowing & np.asarray(round_ready, dtype=bool) & ~np.asarray(converged, dtype=bool)
    # each part on the rows that use it only (`rows.on_rows`: the same numbers, every row computed alone)
    return (on_rows(flowing, partial(_paced, delta, confidence, target), (tau, N_final, n, h, q),
                    fill=np.asarray(tau, dtype=float)),
            on_rows(do_round, partial(_round, delta, confidence, round_labels, target),
                    (N, n, h, q, spread_scale, capacity), (closed, variance_ratio)))


def _paced(delta, confidence, target, tau, N_final, n, h, q) -> np.ndarray:
    return paced_thresholds(tau, N_final, target_labels(N_final, n, h, q, delta, confidence, fpc=True, target=target))


def _round(delta, confidence, round_labels, target, N, n, h, q, spread_scale, capacity, closed,
           variance_ratio) -> np.ndarray:
    N = np.asarray(N, dtype=float)
    D = shortfall_round(round_labels, N, n, h, q, delta, confidence, closed, target, variance_ratio)
    scale = spread_scale
    if not (target is None or target.is_precision):  # the metrics' gradients, on the residual spread if given
        scale = allocation_scale(target.metrics, N, n, h, target.positive) * (1.0 if spread_scale is None
                                                                              else np.asarray(spread_scale))
    want = allocate_opt_track(N, n, h, q, D, with_replacement=False, scale=scale, capacity=capacity)
    return np.maximum(want, catch_up(N, n, h, q, delta, confidence, target, variance_ratio, capacity))


def catch_up(N, n, h, q, delta: float, confidence: float, target=None, variance_ratio=1.0,
             capacity=None) -> np.ndarray:
    """Labels per stratum that bring a stratum with at least `CATCH_UP_MIN_LABELS`
    labels to `CATCH_UP_SHARE` of the closed chunk's target (`target_labels`
    with the finite population correction of the `N` items it holds: a round
    comes only once the arrivals have stopped, and the pace aims at the same
    target): after a paced stream the first round takes most of what is
    missing at once instead of two labels per stratum per round; strata with
    fewer labels, and a burst with none, get ordinary rounds.  Without the
    correction the catch-up aimed at an open chunk's target and overshot where
    the labels are a large share of the chunk (rare positives' recall and F1,
    `docs/decisions/catch-up-target.md`).  The spread comes from the labels
    alone (the score prior of a miscalibrated classifier would overshoot, and a
    threshold is never lowered).  `variance_ratio` scales the targets
    (`shortfall_round`); no stratum goes past its `capacity` (`plan_requests`).
    For a target with a ratio metric (recall, F1) nothing is caught up before
    the chunk's labels hold `CATCH_UP_MIN_POSITIVES` positives, or
    `CATCH_UP_POSITIVES_SHARE` of the positives its strata are estimated to hold
    if that is fewer (`enough_positives`)."""
    n = np.asarray(n, dtype=float)
    p = half_label_smoothed(n, h)  # the labels' own spread: the scores' prior plays no part here
    need = target_labels(N, n, h, p, delta, confidence, fpc=True, target=target)
    short = np.ceil(CATCH_UP_SHARE * need * np.asarray(variance_ratio, dtype=float)[..., None] - n)
    room = room_left(N, n, capacity)
    ready = n >= CATCH_UP_MIN_LABELS
    if target is not None and target.has_ratio:
        ready &= enough_positives(N, h, p)
    return np.where(ready, np.clip(short, 0.0, room), 0.0).astype(np.int64)


def enough_positives(N, h, p) -> np.ndarray:
    """Whether a chunk's labels hold enough positives for recall's and F1's catch-up (per row, shaped
    to broadcast over the strata): `CATCH_UP_MIN_POSITIVES`, or `CATCH_UP_POSITIVES_SHARE` of the
    positives ``sum N_k p_k`` its `N` items per stratum hold at the labels' rates `p`, if fewer."""
    labelled = np.sum(h, axis=-1, keepdims=True)
    held = np.sum(np.asarray(N, dtype=float) * p, axis=-1, keepdims=True)
    return labelled >= np.minimum(CATCH_UP_MIN_POSITIVES, CATCH_UP_POSITIVES_SHARE * held)


def threshold_after(tau: float, free_priorities, extra: int) -> float:
    """A stratum's threshold raised to take `extra` more items: the priority of
    the `extra`-th lowest unrequested item (`free_priorities`, those above the
    current threshold), so the sample stays every item at or below it."""
    if extra <= 0:
        return tau
    free = np.sort(np.asarray(free_priorities, dtype=float))
    if free.size == 0:
        return tau
    return max(tau, float(free[min(extra, free.size) - 1]))
