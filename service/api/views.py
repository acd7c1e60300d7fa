"""What the JSON API and the Prometheus gauges report for one classifier,
computed from the shared Redis state at request/scrape time."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np

from stratameter.schemas.messages import LABEL_OUTCOMES, format_time

from ..chunks import lifecycle
from ..chunks.lifecycle import chunk_closed
from ..chunks.report import StrataColumns, chunk_report
from ..chunks.window import (PendingWindow, WindowPart, WindowReport, pooled_reports, window_chunks,
                             window_lengths)
from ..labels.calibrated import calibration_doc, chunk_calibrations
from ..state.keys import first_negative_stratum, negatives_of
from ..state.chunk_store import ChunkStore
from ..state.process import ProcessState
from ..state.records import ChunkState
from ..stats.confusion import needs_negatives
from ..stats.difference import Calibrated
from ..stats.estimator import Interval
from .closed_chunks import CLOSED, label_mark
from .review_groups import GroupBudget
from .window_cells import CELLS

log = logging.getLogger(__name__)


def _iso(seconds: float) -> str:
    return format_time(round(seconds * 1000))


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def chunk_view(cs: ChunkState, cfg, now_s: float, negatives: ChunkState | None = None,
               calibration: dict[str, Calibrated] | None = None, negatives_complete: bool | None = None,
               complete: bool = True, sampled: bool = True) -> dict:
    """Figures of one chunk.  The estimate and interval stay null until every
    non-empty stratum has the two labels an honest variance needs.  An open
    chunk's interval has no finite population correction (its population is
    still growing); a closed chunk's has, with the chunk's final size.

    The top-level estimate is precision's (from the predicted positives, as far
    as they are sampled); ``metrics`` holds every enabled metric's interval, from
    both sides' strata when the classifier samples its predicted negatives
    (`negatives`, whose strata are listed after the positives' with ids from K).

    A metric's interval (precision's at the top level too) is the difference estimator's where
    its entry in `calibration` (`chunk_calibrations`, with the same finite population correction)
    is active, and ``calibration`` says which.

    `negatives_complete` (None when the classifier's metrics need no predicted negatives): False
    when some of the chunk's predicted negatives never reached their state
    (`lifecycle.counted_whole`); every metric that needs them is then null.  Not `complete` (some
    of its records were counted in a state Redis lost, `app.state_watch`): every metric is null."""
    closed = chunk_closed(cs.chunk, cfg, now_s)
    sides = _sides(cs, negatives, cfg)
    strata = [row for side, first, name in sides for row in _strata(side, first, name)]
    report = chunk_report(_columns(sides), cfg.metrics.split(","), cfg.confidence, closed, calibration,
                          negatives_complete, complete)
    lead = cs if cs.N.sum() else negatives
    status = report.status(lead.status, lead.status_closed, cfg.delta, sampled)
    # a converged chunk is read where the stopping rule stopped: its estimate carries the rule's term
    metrics = {m: _interval_doc(iv, status == "converged") for m, iv in report.intervals.items()}
    top = _interval_doc(report.precision, status == "converged")
    return {
        "chunk": {"start": _iso(cs.chunk * cfg.chunk_seconds), "end": _iso((cs.chunk + 1) * cfg.chunk_seconds)},
        "estimate": top["estimate"],
        "ci_lower": top["ci_lower"],
        "ci_upper": top["ci_upper"],
        "stderr": top["stderr"],
        "metrics": metrics,
        "labels": sum(int(side.n.sum()) for side, _, _ in sides),
        "population": sum(int(side.N.sum()) for side, _, _ in sides),
        "rounds": max(side.round for side, _, _ in sides),
        "status": status,
        "closed": closed,
        "negatives_complete": negatives_complete,
        "complete": complete,
        "calibration": calibration_doc(calibration),
        "strata": strata,
    }


def _sides(cs: ChunkState, negatives: ChunkState | None, cfg) -> list[tuple[ChunkState, int, str]]:
    """A chunk's sides as (state, first stratum id, side name): the predicted positives', then the
    predicted negatives' (ids from K) when the classifier samples them."""
    negatives_from = first_negative_stratum(cfg.strata, cs.strata)  # `_lead`'s empty chunk has cfg.strata
    sides = [(cs, 0, "positive")] + ([(negatives, negatives_from, "negative")] if negatives is not None else [])
    if cs.N.sum() == 0 and negatives is not None:
        sides = sides[1:]  # a chunk of predicted negatives only: no positive stratum to list
    return sides


def _strata(cs: ChunkState, first: int, side: str) -> list[dict]:
    """The listing of one side's strata (stratum ids from `first`)."""
    lower_edges = np.concatenate([[cs.min], cs.cuts])
    upper_edges = np.concatenate([cs.cuts, [cs.max]])
    return [{
        "stratum": first + k, "side": side, "lower_score": _num(lower_edges[k]), "upper_score": _num(upper_edges[k]),
        "items": int(cs.N[k]), "labels": int(cs.n[k]), "positives": int(cs.h[k]),
        "precision": float(cs.h[k] / cs.n[k]) if cs.n[k] else None,
    } for k in range(cs.strata)]


def _columns(sides: list) -> StrataColumns:
    """The strata of `sides` ((chunk state, first stratum id, side name)), in order."""
    N, n, h = (np.concatenate([getattr(side, c) for side, _, _ in sides]) for c in ("N", "n", "h"))
    return StrataColumns(N, n, h, np.concatenate([np.full(side.strata, name == "positive") for side, _, name in sides]))


#: A metric's document while it has no interval.
NO_INTERVAL = {"estimate": None, "ci_lower": None, "ci_upper": None, "stderr": None}


def _interval_doc(iv: Interval | None, stopped: bool = False) -> dict:
    """``{estimate, ci_lower, ci_upper, stderr}``, all null unless the interval is finite (or
    `iv` is None); the estimate at the stop where `stopped` (`Interval.estimate_at_stop`)."""
    if iv is None:
        return dict(NO_INTERVAL)
    ok = np.isfinite(iv.lower) and np.isfinite(iv.upper)
    estimate = iv.estimate_at_stop if stopped else iv.estimate
    if ok:  # never outside the interval it is reported with (a rounding error past a widthless one)
        estimate = np.clip(estimate, iv.lower, iv.upper)
    return {"estimate": _num(estimate) if ok else None, "ci_lower": _num(iv.lower) if ok else None,
            "ci_upper": _num(iv.upper) if ok else None, "stderr": _num(iv.stderr) if ok else None}


def reported_chunk(chunks: list[dict], starts: list[float], now_s: float) -> dict | None:
    """The chunk the gauges report: the newest chunk that has started (never one in
    the future) once its interval exists, else the one before it if that has one."""
    started = [c for c, start in zip(chunks, starts) if start <= now_s]
    if not started:
        return None
    if started[-1]["estimate"] is None and len(started) > 1 and started[-2]["estimate"] is not None:
        return started[-2]
    return started[-1]


async def classifier_view(store: ChunkStore, process: ProcessState, cid: str, cfg, history: bool = True,
                          later: list | None = None, group: GroupBudget | None = None) -> dict | None:
    """The `GET /v1/classifiers/{id}` document (None for an unknown id).  Without `history` (what
    the gauges need) only the chunks a scrape shows are read: the two newest started (the reported
    one among them), the last closed one, and the chunks of the longest window, of which only the
    counts per stratum are used; ``history`` is empty: a scrape's cost does not grow with
    HISTORY_CHUNKS.  With `later` (a list), the document's windows are left to pool with other
    classifiers' (`WindowJob`s appended to it, `finish_windows`).  `group`: the budget of the review
    group it is in (`review_groups.member_budget`), None outside one."""
    now_s = time.time()
    sides = [cid] + ([negatives_of(cid)] if needs_negatives(cfg.metrics.split(",")) else [])
    summary, *other = await store.overviews(sides, int(now_s * 1000))
    if not summary["meta"]:
        return None
    ids_by_side = [summary["chunk_ids"]] + [o["chunk_ids"] for o in other]
    held = sorted(set().union(*ids_by_side))
    shut = lifecycle.closed_among(held, cfg, now_s)  # the chunks closed, once for every use below
    wanted, viewed = _to_read(held, shut, cfg, now_s, history)
    found = [await _read(store, sid, [t for t in wanted if t in set(side_ids)], viewed, shut,
                         label_mark(overview["counters"]))
             for sid, side_ids, overview in zip(sides, ids_by_side, [summary, *other])]
    ids = sorted(set().union(*found))
    # precision too where it is not enabled: the top-level fields describe it
    wanted_metrics = tuple(dict.fromkeys(["precision", *cfg.metrics.split(",")]))
    unpaired = summary["meta"].get("unpaired_through_ms")
    complete = {t: lifecycle.counted_whole(t, cfg.chunk_seconds, None if unpaired is None else int(unpaired))
                if other else None for t in ids}
    whole = {t: lifecycle.counted_whole(t, cfg.chunk_seconds, process.lost_through_ms) for t in ids}
    calibrations = {}
    for t in ids[-cfg.chunk_retention:]:  # older: no histogram kept
        if t in found[0] and whole[t] and t in viewed:
            by_side, metrics = _calibrated(t, cid, sides, found, wanted_metrics, complete[t])
            calibrations[t] = await chunk_calibrations(store, by_side, cfg, t in shut, metrics)
    sampled = set(lifecycle.sampled_chunks(set().union(*ids_by_side), cfg.chunk_seconds, now_s, cfg.chunk_retention))
    lead = {t: _lead(found[0].get(t), found[-1].get(t), cfg, t) for t in ids}
    negatives = {t: found[1].get(t) if len(found) > 1 else None for t in ids}
    shown = [t for t in ids if t in viewed]
    chunks = [chunk_view(lead[t], cfg, now_s, negatives[t], calibrations.get(t), complete[t], whole[t], t in sampled)
              for t in shown]
    reported = reported_chunk(chunks, [t * cfg.chunk_seconds for t in shown], now_s)
    reported_id = next((t for t, c in zip(shown, chunks) if c is reported), None)
    inputs = {t: (t, lead[t], negatives[t], whole[t], complete[t]) for t in ids}
    doc = {"classifier_id": cid, **_counters_doc(summary, other, cfg, now_s, group),
           **_reported_fields(reported, cfg, other)}
    doc["windows"] = {}
    jobs = [WindowJob(doc["windows"], name, _window((store.keys.prefix, cid, k), window_chunks(reported_id, ids, k),
                                                    inputs, shut, cfg), reported_id, k, cfg)
            for name, k in window_lengths(cfg.windows, cfg.chunk_seconds).items()]
    if later is None:
        _finish(jobs)
    else:
        later.extend(jobs)
    doc["last_closed"] = _last_closed(shown, chunks, now_s, cfg)
    doc["history"] = [c for c in chunks if c is not reported] if history else []
    return doc


def _window(key: tuple, members: list[int], inputs: dict[int, tuple], shut: set[int], cfg) -> PendingWindow:
    """The window of the chunks `members` (oldest first; `inputs`: each chunk's states and flags;
    `shut`: the chunks closed), to pool: its closed chunks' sums as the process remembers them under
    `key` (`window_cells.CELLS`), and its open chunks' parts."""
    metrics = tuple(cfg.metrics.split(","))
    closed = next((i for i, t in enumerate(members) if t not in shut), len(members))

    def parts(ts: list[int]) -> list[WindowPart]:
        return [WindowPart(t, _columns(_sides(lead, negatives, cfg)), t in shut, whole, complete,
                           stopped=lead.status == "converged") for t, lead, negatives, whole, complete
                in (inputs[t] for t in ts)]

    held = CELLS.cells(key, tuple(inputs[t] for t in members[:closed]), lambda: parts(members[:closed]),
                       metrics) if closed else None
    return PendingWindow(held, parts(members[closed:]))


@dataclass(frozen=True)
class WindowJob:
    """A window of a classifier's document still to pool (`finish_windows`), and where its document
    goes: `into` (the document's ``windows``) under `name`."""

    into: dict
    name: str
    window: PendingWindow
    reported: int | None
    length: int
    cfg: object


def finish_windows(jobs: list[WindowJob]) -> None:
    """Pool the windows of `jobs` (of many classifiers: a scrape's), those of classifiers with the same
    metrics and confidence together (`chunks.window.pooled_reports`: the open chunks' arithmetic in one
    call instead of one a classifier), and write each window's document where it goes.  If a group
    cannot be pooled together, each of its windows is pooled alone, and one that fails is left out of
    its document (logged): the other classifiers keep theirs."""
    groups: dict[tuple, list[WindowJob]] = {}
    for job in jobs:
        groups.setdefault((job.cfg.metrics, job.cfg.confidence), []).append(job)
    for group in groups.values():
        try:
            _finish(group)
        except Exception:  # noqa: BLE001  (a bug in one window must not cost the others theirs)
            log.exception("pooling %d windows together failed; pooling each alone", len(group))
            for job in group:
                try:
                    _finish([job])
                except Exception:  # noqa: BLE001
                    log.exception("window %s of a classifier could not be pooled", job.name)


def _finish(jobs: list[WindowJob]) -> None:
    """`finish_windows` of jobs with the same metrics and confidence, together."""
    cfg = jobs[0].cfg
    for job, report in zip(jobs, pooled_reports([j.window for j in jobs], cfg.metrics.split(","), cfg.confidence)):
        job.into[job.name] = _window_doc(report, job.reported, job.length, job.cfg)


def _to_read(ids: list[int], shut: set[int], cfg, now_s: float, history: bool) -> tuple[list[int], list[int]]:
    """The chunks of `ids` to read, and those of them to view whole: all of them with `history`;
    else the two newest started and the last closed one to view, and the chunks of the longest
    window before them too (their counts only; `shut`: the chunks closed)."""
    if history:
        return ids, ids
    started = [t for t in ids if t * cfg.chunk_seconds <= now_s]
    closed = [t for t in started if t in shut]
    viewed = sorted(set(started[-2:] + closed[-1:]))
    longest = max(window_lengths(cfg.windows, cfg.chunk_seconds).values(), default=1)
    return sorted(set(viewed + started[-(longest + 1):])), viewed


async def _read(store: ChunkStore, sid: str, ids: list[int], viewed: list[int], shut: set[int], mark: tuple
                ) -> dict[int, ChunkState]:
    """State `sid`'s chunks `ids` by id: those `viewed` and those still open read whole, the other
    closed ones (a window's counts only) through the process's memory of closed chunks (`mark`:
    the state's `closed_chunks.label_mark`)."""
    counted = [t for t in ids if t not in viewed and t in shut]
    whole = await store.chunk_states(sid, [t for t in ids if t not in counted])
    return {cs.chunk: cs for cs in [*whole, *await CLOSED.states(store, sid, counted, mark)]}


def _counters_doc(summary: dict, other: list[dict], cfg, now_s: float, group: GroupBudget | None) -> dict:
    """The classifier's counters over all its chunks (the negatives' requests and answers count as
    the classifier's) and the label budget left now: its own, and in a review `group` no more than
    the group's (both budgets hold)."""
    pending = summary["pending"] + sum(o["pending"] for o in other)
    counters = summary["counters"]
    for o in other:
        counters = _summed(counters, o["counters"])
    issued = summary["issued"] + sum(o["issued"] for o in other)
    # whole seconds into the hour, as the request loop reads them: the two never disagree by a label
    allowed = lifecycle.allowance_at(cfg.max_labels_per_hour, int(now_s * 1000))
    left = max(0, allowed - issued) if group is None else min(max(0, allowed - issued), group.remaining)
    return {
        "confidence": cfg.confidence,
        "delta": cfg.delta,
        "scores": int(summary["meta"].get("scores_total", 0)),
        "pending": pending,
        "label_requests": int(counters.get("requests_total", 0)),
        "label_requests_joined": int(counters.get("requests_joined", 0)),
        "requests_expired": int(counters.get("requests_expired", 0)),
        "last_label_at": _iso(int(counters["last_label_ms"]) / 1000) if "last_label_ms" in counters else None,
        "labels_by_outcome": {o: int(counters.get(f"labels_{o}", 0)) for o in LABEL_OUTCOMES},
        "review_group": None if group is None else group.group,
        "label_budget_remaining": left,
    }


def _reported_fields(reported: dict | None, cfg, other: list[dict]) -> dict:
    """The reported chunk's fields of the document (empty ones before any chunk has started)."""
    base = reported or {"estimate": None, "ci_lower": None, "ci_upper": None, "stderr": None, "labels": 0,
                        "population": 0, "chunk": None, "strata": [], "rounds": 0, "status": "open", "closed": False}
    base.setdefault("metrics", {m: dict(NO_INTERVAL) for m in cfg.metrics.split(",")})
    base.setdefault("calibration", None)
    base.setdefault("negatives_complete", True if other else None)
    base.setdefault("complete", True)
    return {k: base[k] for k in ("estimate", "ci_lower", "ci_upper", "stderr", "metrics", "labels", "population",
                                 "chunk", "strata", "rounds", "status", "closed", "negatives_complete", "complete",
                                 "calibration")}


def _window_doc(window: WindowReport, reported: int | None, length: int, cfg) -> dict:
    """A window's document: its nominal span (the reported chunk and the `length` - 1 before it),
    the chunks pooled, their labels and items, every enabled metric's interval, and the chunks that
    made a metric null (`chunks.window`)."""
    start = None if reported is None else _iso((reported - length + 1) * cfg.chunk_seconds)
    end = None if reported is None else _iso((reported + 1) * cfg.chunk_seconds)
    return {"start": start, "end": end, "chunks": len(window.chunks), "population": window.population,
            "labels": window.labels, "complete": window.complete,
            "incomplete_chunks": [_iso(t * cfg.chunk_seconds) for t in window.incomplete_chunks],
            "metrics": {m: _interval_doc(iv) for m, iv in window.intervals.items()}}


def _last_closed(ids: list[int], chunks: list[dict], now_s: float, cfg) -> dict | None:
    """The newest closed chunk's current figures (closed chunks still take top-up rounds), ``final``
    once its status will not change (`lifecycle.FINISHED` or ``stopped``); None before a chunk closed."""
    closed = [c for t, c in zip(ids, chunks) if c["closed"] and t * cfg.chunk_seconds <= now_s]
    if not closed:
        return None
    c = closed[-1]
    return {"chunk": c["chunk"], "status": c["status"], "final": c["status"] in (*lifecycle.FINISHED, "stopped"),
            "labels": c["labels"], "population": c["population"], "metrics": c["metrics"]}


def _calibrated(t: int, cid: str, sides: list[str], found: list[dict], metrics: tuple, negatives_complete):
    """The sides and metrics of chunk `t` the difference estimator is computed for: precision's
    alone from the predicted positives where the negatives are not complete (the metrics that need
    them are null there, `chunk_view`)."""
    by_side = [(sid, f.get(t), sid == cid) for sid, f in zip(sides, found)]
    return (by_side[:1], ("precision",)) if negatives_complete is False else (by_side, metrics)


def _lead(positives: ChunkState | None, negatives: ChunkState | None, cfg, t: int) -> ChunkState:
    """The chunk's state of the predicted positives; an empty one (the configured K strata
    with no item) when only predicted negatives have arrived in the chunk."""
    if positives is not None:
        return positives
    return ChunkState(t, np.full(max(cfg.strata - 1, 0), np.nan), *(np.zeros(cfg.strata) for _ in range(3)),
                      status=negatives.status if negatives is not None else "open")


def _summed(a: dict, b: dict) -> dict:
    """Two counter hashes added (``last_label_ms``: the later)."""
    out = dict(a)
    for k, v in b.items():
        if k == "last_label_ms":
            out[k] = str(max(int(v), int(a.get(k, 0))))
        else:
            out[k] = str(int(a.get(k, 0)) + int(v))
    return out
