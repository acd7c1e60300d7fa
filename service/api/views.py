"""What the JSON API and the Prometheus gauges report for one classifier,
computed from the shared Redis state at request/scrape time."""

from __future__ import annotations

import math
import time

import numpy as np

from stratameter.schemas.messages import LABEL_OUTCOMES, format_time

from ..state.store import ChunkState, Store
from ..stats import streams


def _iso(seconds: float) -> str:
    return format_time(round(seconds * 1000))


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def chunk_view(cs: ChunkState, cfg, now_s: float) -> dict:
    """Figures of one chunk.  The estimate and interval stay null until every
    non-empty stratum has the two labels an honest variance needs.  An open
    chunk's interval has no finite population correction (its population is
    still growing); a closed chunk's has, with the chunk's final size."""
    chunk_seconds = cfg.chunk_seconds
    closed = bool(streams.is_closed(now_s, (cs.chunk + 1) * chunk_seconds, _lateness(cfg)))
    iv = streams.chunk_interval(cs.N, cs.n, cs.h, cfg.confidence, closed) if cs.N.sum() else None
    lower_edges = np.concatenate([[cs.min], cs.cuts])
    upper_edges = np.concatenate([cs.cuts, [cs.max]])
    strata = []
    for k in range(cs.strata):
        strata.append({
            "stratum": k, "lower_score": _num(lower_edges[k]), "upper_score": _num(upper_edges[k]),
            "items": int(cs.N[k]), "labels": int(cs.n[k]), "positives": int(cs.h[k]),
            "precision": float(cs.h[k] / cs.n[k]) if cs.n[k] else None,
        })
    ok = iv is not None and iv.lower == iv.lower  # not NaN
    return {
        "chunk": {"start": _iso(cs.chunk * chunk_seconds), "end": _iso((cs.chunk + 1) * chunk_seconds)},
        "estimate": _num(iv.estimate) if ok else None,
        "ci_lower": _num(iv.lower) if ok else None,
        "ci_upper": _num(iv.upper) if ok else None,
        "stderr": _num(iv.stderr) if ok else None,
        "labels": int(cs.n.sum()),
        "population": int(cs.N.sum()),
        "rounds": cs.round,
        "status": _status(cs, iv, cfg.delta),
        "closed": closed,
        "strata": strata,
    }


def _lateness(cfg) -> float:
    return float(getattr(cfg, "allowed_lateness_seconds", 300))


def _status(cs: ChunkState, iv, delta: float) -> str:
    """The loop's status, but never `converged` while the reported interval is wider than delta
    (the loop may not have run since the population grew or the chunk closed)."""
    if cs.status != "converged":
        return cs.status
    return "converged" if iv is not None and float(iv.halfwidth) <= delta else "open"


def reported_chunk(chunks: list[dict], starts: list[float], now_s: float) -> dict | None:
    """The chunk the gauges report: the newest chunk that has started (never one in
    the future) once its interval exists, else the one before it if that has one."""
    started = [c for c, start in zip(chunks, starts) if start <= now_s]
    if not started:
        return None
    if started[-1]["estimate"] is None and len(started) > 1 and started[-2]["estimate"] is not None:
        return started[-2]
    return started[-1]


async def classifier_view(store: Store, cid: str, cfg) -> dict | None:
    """The `GET /v1/classifiers/{id}` document (None for an unknown id)."""
    summary = await store.classifier_summary(cid)
    if not summary["meta"]:
        return None
    now_s = time.time()
    ids = await store.chunk_ids(cid)
    states = await store.chunks(cid, ids)
    chunks = [chunk_view(c, cfg, now_s) for c in states]
    reported = reported_chunk(chunks, [c.chunk * cfg.chunk_seconds for c in states], now_s)
    counters = summary["counters"]
    doc = {
        "classifier_id": cid,
        "confidence": cfg.confidence,
        "delta": cfg.delta,
        "scores": int(summary["meta"].get("scores_total", 0)),
        "pending": summary["pending"],
        "label_requests": int(counters.get("requests_total", 0)),
        "requests_expired": int(counters.get("requests_expired", 0)),
        "last_label_at": _iso(int(counters["last_label_ms"]) / 1000) if "last_label_ms" in counters else None,
        "labels_by_outcome": {o: int(counters.get(f"labels_{o}", 0)) for o in LABEL_OUTCOMES},
    }
    base = reported or {"estimate": None, "ci_lower": None, "ci_upper": None, "stderr": None, "labels": 0,
                        "population": 0, "chunk": None, "strata": [], "rounds": 0, "status": "open", "closed": False}
    doc.update({k: base[k] for k in ("estimate", "ci_lower", "ci_upper", "stderr", "labels", "population", "chunk",
                                     "strata", "rounds", "status", "closed")})
    issued = await store.issued_this_hour(cid, int(now_s * 1000))
    # whole seconds into the hour, as the request loop reads them: the two never disagree by a label
    doc["label_budget_remaining"] = max(0, int(streams.budget_allowance(cfg.max_labels_per_hour,
                                                                        int(now_s) % 3600)) - issued)
    doc["history"] = [c for c in chunks if c is not reported]
    return doc
