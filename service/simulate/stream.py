"""`stratameter simulate --stream`: a chunk whose population arrives while it is sampled.

Each run replays a fresh sample of a population as the arrivals of one
event-time chunk ``[0, chunk_seconds)`` and runs the request loop of the
service on it, step by step, with the same pure functions
(`stratameter.stats.streams`, `allocation`, `stopping`): threshold (sequential
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
   `lifecycle.budget_allowance` minus this clock hour's requests allows.

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
import numpy as np

from ..chunks import lifecycle
from ..stats import allocation, stopping, streams
from .arrivals import SCENARIOS, Chunks, Scenario, StreamSettings, draw, ranges
from .populations import Population
from .stream_items import DeferredRounds, arrivals_by_step, chunk_calibration, next_steps, raised_thresholds
from .stream_result import StreamResult
from .trace import GaugeRecorder

__all__ = ["SCENARIOS", "Scenario", "StreamSettings", "StreamResult", "draw", "run_stream"]


def run_stream(pop: Population, scenario: Scenario, s: StreamSettings, runs: int, seed,
               trace_runs: int = 0, keep_items: bool = False, gauge_seconds: float | None = None) -> StreamResult:
    """R runs of the service's request loop on chunks drawn by `draw` (`run_chunks`), with the
    calibration (``s.calibration_min_labels``) a fold per item drawn after them, so a run's chunk is
    the same with the calibration off."""
    rng = np.random.default_rng(seed)
    c = draw(pop, scenario, s, runs, rng)
    fold = rng.integers(0, 2, c.key.size, dtype=np.int8) if s.calibration_min_labels and c.target is None else None
    return run_chunks(c, s, fold, trace_runs=trace_runs, keep_items=keep_items, gauge_seconds=gauge_seconds)


def run_chunks(c: Chunks, s: StreamSettings, fold: np.ndarray | None = None, calibrated: np.ndarray | None = None,
               groups: np.ndarray | None = None, trace_runs: int = 0, keep_items: bool = False,
               gauge_seconds: float | None = None, recorder: GaugeRecorder | None = None) -> StreamResult:
    """The service's request loop on the drawn chunks `c` (`run_stream`), with the calibration where
    `fold` (its fold per item) is given, on the runs `calibrated` (default all).

    As in the service (`requests.loop`): a step is skipped where nothing the
    design looks at changed since the chunk's last step (items, labels,
    pending requests, flowing, closed, thresholds) unless the chunk waits for
    the budget; thresholds are stored only when a step issues requests (a
    raise that finds no arrived item is recomputed at the next step); the
    score prior is re-read when the chunk has grown by a tenth.
    The estimate at a run's stop is the reading at the stopping rule's stop
    (`Interval.estimate_at_stop`) where the run converged, the plain reading
    (`Interval.estimate`) where it stopped otherwise (exhausted, capped).
    With `gauge_seconds`, the gauge's readings every that many seconds of every
    run (`trace.GaugeRecorder`; ``out.gauge``); with `recorder`, that recorder's readings instead (a
    `trace.GaugeRecorder` made for these runs, e.g. `chunk_states.CountRecorder`).
    `groups` (a group per run): the chunks of several draws (`arrivals.concat`), each group stepped
    as if alone (a group's steps are its own runs' events; the runs of a group due at a step are
    the only ones that step), so each run's numbers are those of its draw run alone.
    Long because a step reads and writes some forty arrays over (runs,
    strata) and items: split, each part would take most of them as
    parameters, and the step would no longer read top to bottom in the order
    of `requests/loop.py` (what the step reads off the items is in
    `stream_items`, what a run leaves at its stop in `stream_result`).
    """
    R, K, M = c.runs, c.K, c.M
    group = np.zeros(R, dtype=np.int64) if groups is None else np.asarray(groups, dtype=np.int64)
    G = int(group.max(initial=0)) + 1
    if G > 1 and (trace_runs or gauge_seconds is not None or recorder is not None):
        raise ValueError("groups of draws are stepped without the per-step trace and the gauge")
    dt = float(s.step_seconds)
    T = float(s.chunk_seconds)
    end, close_t = T, T + float(s.lateness)
    cap_t = close_t + float(s.cap_seconds)
    close_step, cap_step = math.ceil(close_t / dt - 1e-9), math.ceil(cap_t / dt - 1e-9)
    D = allocation.round_size(K, s.labels_per_stratum)
    timeout = float(s.label_timeout)
    labelled = ~c.skip & (c.delay <= timeout)
    step_of = np.minimum(c.delay.astype(np.float64), timeout)  # steps until the answer lands (in place)
    step_of /= dt
    step_of -= 1e-9
    step_of = np.maximum(np.ceil(step_of, out=step_of), 1.0, out=step_of).astype(np.int64)
    S = int(step_of.max()) + 1
    ring_n = np.zeros((S, R, K), dtype=np.int32)
    ring_h = np.zeros((S, R, K), dtype=np.int32)
    ring_c = np.zeros((S, R), dtype=np.int32)
    ring_live = np.zeros((S, G), dtype=np.int64)  # per slot and group, the requests of its active runs landing
    budget = s.max_labels_per_hour
    silence = streams.min_silence(T)
    calibrating = fold is not None and bool(s.calibration_min_labels) and c.target is None
    cal_runs = np.ones(R, dtype=bool) if calibrated is None else np.asarray(calibrated, dtype=bool)
    deferred = None
    if calibrating:
        lands = np.full(c.key.size, np.iinfo(np.int64).max)  # the step a label lands at
        memo: dict = {}  # each run's last histogram (`chunk_calibration`)
        if budget is None and not trace_runs and s.stop_rounds >= 1:  # where a flowing chunk's status is idle
            deferred = DeferredRounds(int(s.stop_rounds), s.delta)

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
    waiting_now = np.zeros(R, dtype=bool)  # status_now == "waiting_for_budget"
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
    cal_active = np.zeros(R, dtype=bool)  # the difference estimator's interval is the one reported
    cal_hw = np.full(R, np.nan)  # its half-width, as last computed
    gauge = calibrate_gauge = None
    if gauge_seconds is not None or recorder is not None:
        gauge = recorder or GaugeRecorder(R, K, gauge_seconds, end, s.lateness, s.confidence, c.target, c.metric,
                                          c.positive)
        if calibrating:
            def calibrate_gauge(t, closed_t, a):  # the runs `a` whose gauge shows the difference estimator's
                step_t = int(math.floor(t / dt + 1e-9))  # the labels landed by t
                for i in np.flatnonzero((n[a].sum(axis=1) >= s.calibration_min_labels) & cal_runs[a]):
                    cal = chunk_calibration(c, int(a[i]), step_t, t, N[a[i]], lands, fold, closed_t, s, memo)
                    if cal.active:
                        yield i, cal.interval

    out = StreamResult.start(c, overflow, blocked_steps)
    arrived_by = arrivals_by_step(c, dt, T)
    n_arr = arrived_by.shape[1]
    hour = -1
    next_g = np.zeros(G, dtype=np.int64)  # each group's next step
    while active.any():
        step = int(next_g.min())
        due_g = next_g == step
        due_run = due_g[group]
        now = step * dt
        sl = step % S
        if gauge is not None:  # the readings the skipped steps left: nothing changed in them
            gauge.before(now, active, N, n, h, calibrate_gauge)
        # 1. answers land
        n += ring_n[sl]
        h += ring_h[sl]
        pend -= ring_c[sl]
        ring_n[sl] = 0
        ring_h[sl] = 0
        ring_c[sl] = 0
        ring_live[sl] = 0  # (the groups with answers landing now are due now)
        # arrivals: counted; those at or below a stored threshold are due
        new_ptr = arrived_by[:, min(step, n_arr - 1)]
        grew = np.flatnonzero((new_ptr > ptr) & due_run)
        fresh = np.empty(0, dtype=np.int64)
        if grew.size:
            li = c.arr_li[ranges(grew * M + ptr[grew], new_ptr[grew] - ptr[grew])]
            rr = li // M
            kk = c.stratum[li].astype(np.int64)
            flat = rr * K + kk
            N += np.bincount(flat, minlength=R * K).reshape(R, K)
            if gauge is not None:
                gauge.arrived(flat, c.y[li])
            qsum += np.bincount(flat, weights=c.prob[li], minlength=R * K).reshape(R, K)
            first[grew] = np.where(np.isnan(first[grew]), c.arr_key[grew * M] - c.arr_base[grew], first[grew])
            last[grew] = c.arr_key[grew * M + new_ptr[grew] - 1] - c.arr_base[grew]
            fresh = li[(li - c.off[rr, kk]) < m[rr, kk]]
            ptr[grew] = new_ptr[grew]
        if gauge is not None:
            gauge.at(now, active, N, n, h, calibrate_gauge)
        closed = bool(lifecycle.is_closed(now, end, s.lateness))
        capped = now >= cap_t
        if budget is not None and int(now // 3600) != hour:
            hour = int(now // 3600)
            issued_hour[:] = 0
        # 2. the loop, for the runs whose chunk has its strata and where something it looks at changed
        live = np.flatnonzero(active & due_run & (now >= c.start))
        total_l = N[live].sum(axis=1)
        flowing_l = streams.arrivals_flowing(total_l, first[live], last[live], now, end, T) & (not closed)
        key_l = np.column_stack([total_l, n[live].sum(axis=1), pend[live], flowing_l, np.full(live.size, closed),
                                 tau[live]])
        changed = (key_l != seen[live]).any(axis=1) | waiting_now[live] | capped
        rows = live[changed]
        flowing = flowing_l[changed]
        seen[rows] = key_l[changed]
        issued_now = np.zeros(R, dtype=np.int64)
        if rows.size:
            Nr, nr, hr = N[rows], n[rows], h[rows]
            total = total_l[changed]
            final = streams.expected_final_size(total, first[rows], last[rows], now, end, T)
            N_final = Nr * (final / total)[:, None]
            iv = streams.chunk_interval(Nr, nr, hr, s.confidence, closed, c.target)
            est, lower, upper, hw = iv.estimate.copy(), iv.lower.copy(), iv.upper.copy(), iv.halfwidth.copy()
            est_stop = np.array(iv.estimate_at_stop, dtype=float)  # the reading at the stopping rule's stop
            labels = nr.sum(axis=1)
            ready = pend[rows] == 0
            ev = ready & (labels > evaluated[rows])
            ratio, scale = np.ones(rows.size), None
            if calibrating:  # as `requests.loop`: the difference estimator's interval where its switch keeps it
                # a flowing chunk's step that evaluates no round uses its interval only for its status:
                # there the last one computed stands in (two thirds of the fits saved)
                fresh_fit = (labels >= s.calibration_min_labels) & (ev | ~flowing) & cal_runs[rows]
                if deferred is not None:  # a flowing chunk's rounds are fitted once it stops flowing
                    for i in np.flatnonzero(~flowing):
                        if rows[i] in deferred:
                            r = int(rows[i])
                            streak[r], cal = deferred.resolve(r, lambda t, at, Nt: chunk_calibration(
                                c, r, t, at, Nt, lands, fold, False, s, memo))
                            cal_active[r], cal_hw[r] = cal.active, cal.interval.halfwidth
                    for i in np.flatnonzero(fresh_fit & flowing):
                        deferred.add(int(rows[i]), int(streak[rows[i]]), step, now, Nr[i], float(hw[i]))
                    fresh_fit &= ~flowing
                for i in np.flatnonzero(fresh_fit):
                    cal = chunk_calibration(c, int(rows[i]), step, now, Nr[i], lands, fold, closed, s, memo)
                    cal_active[rows[i]] = cal.active
                    cal_hw[rows[i]] = cal.interval.halfwidth
                    if cal.active:
                        iv_i = cal.interval
                        est[i], lower[i], upper[i], hw[i] = iv_i.estimate, iv_i.lower, iv_i.upper, iv_i.halfwidth
                        est_stop[i] = iv_i.estimate_at_stop
                        ratio[i] = cal.variance_ratio
                        scale = np.ones_like(Nr) if scale is None else scale
                        scale[i] = cal.allocation_scale
                stale = ~fresh_fit & cal_active[rows]
                hw[stale] = cal_hw[rows[stale]]
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
                                                s.delta, s.confidence, D, closed=closed, target=c.target,
                                                variance_ratio=ratio, spread_scale=scale)
            wr, wk = np.nonzero(want > 0)
            if wr.size:
                tau_r[wr, wk] = raised_thresholds(c, rows[wr], wk, tau_r[wr, wk], m[rows[wr], wk], want[wr, wk], now)
            tau_r = np.maximum(tau[rows], tau_r)
            m_r = m[rows].copy()
            cr, ck = np.nonzero(tau_r > tau[rows])
            if cr.size:
                g = rows[cr]
                m_r[cr, ck] = c.prefix(g, ck, tau_r[cr, ck])
            # due: waiting below the stored thresholds, fresh arrivals below them, arrived items the raise passes
            li = ranges(c.off[rows[cr], ck] + m[rows[cr], ck], m_r[cr, ck] - m[rows[cr], ck])
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
                allowed = np.maximum(0, lifecycle.budget_allowance(budget, now % 3600) - issued_hour)
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
                if calibrating:
                    lands[issue[lab]] = step + step_of[issue[lab]]
                np.add.at(ring_n, (slot, ir, ik), lab)
                np.add.at(ring_h, (slot, ir, ik), lab & (c.y[issue] == 1))
                np.add.at(ring_c, (slot, ir), 1)
                np.add.at(ring_live, (slot, group[ir]), 1)
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
            complete = ready & (n_due[rows] == 0)
            nothing_left = (left == 0) & complete
            finished = ready & (converged | nothing_left)
            done = closed & (finished | capped)
            status = lifecycle.chunk_status(st, hw, s.delta, s.stop_rounds, closed, nothing_left, blocked[rows], complete)
            status_now[rows] = status
            waiting_now[rows] = status == "waiting_for_budget"
            if trace_runs:
                for i in np.flatnonzero(rows < trace_runs):
                    r = rows[i]
                    out.trace.append({
                        "run": int(r), "t": now, "N": N[r].copy(), "n": n[r].copy(), "h": h[r].copy(),
                        "q": q[r].copy(), "pending": int(pend[r] - issued_now[r]), "tau": tau[r].copy(),
                        "tau_step": tau_r[i].copy(), "want": want[i].copy(), "flowing": bool(flowing[i]),
                        "closed": closed, "final": float(final[i]), "estimate": float(est[i]),
                        "halfwidth": float(hw[i]), "streak": int(st[i]), "converged": bool(converged[i]),
                        "issued": int(issued_now[r]), "issued_hour": int(issued_hour[r]),
                        "waiting": int(n_waiting[r]), "status": str(status[i]), "requested": req_k[r].copy()})
            if done.any():
                d = rows[done]
                out.stopped(d, labels=labels[done], requests=issued_total[d],
                            estimate=np.where(status[done] == "converged", est_stop[done], est[done]),
                            lower=lower[done], upper=upper[done], halfwidth=hw[done], converged=converged[done],
                            closed=closed, status=status[done], capped=~finished[done], stop_seconds=now,
                            tau=tau[d], n=n[d], h=h[d], N=N[d], calibrated=cal_active[d])
                active[d] = False
                np.add.at(ring_live.T, group[d], -ring_c[:, d].T)
        next_g = np.where(due_g, next_steps(step, dt, S, active, ring_live, ptr, c, first, last, N, waiting_now, end,
                                            silence, close_step, cap_step, group), next_g)
    if keep_items:
        out.chunks, out.requested, out.requested_at = c, requested, requested_at
    if gauge is not None:
        out.gauge = gauge.result()
    return out

