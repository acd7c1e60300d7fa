"""What the JSON API and the Prometheus gauges report for one classifier,
computed from the shared Redis state at request/scrape time."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import numpy as np

from ..state.store import ChunkState, Store
from ..stats import estimator


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat().replace("+00:00", "Z")


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def chunk_view(cs: ChunkState, chunk_seconds: int, confidence: float) -> dict:
    """Figures of one chunk.  The estimate and interval stay null until every
    non-empty stratum has the two labels an honest variance needs."""
    iv = estimator.interval(cs.N, cs.n, cs.h, confidence, "wilson", fpc=True) if cs.N.sum() else None
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
        "status": cs.status,
        "strata": strata,
    }


async def classifier_view(store: Store, cid: str, cfg) -> dict | None:
    """The `GET /v1/classifiers/{id}` document (None for an unknown id)."""
    summary = await store.classifier_summary(cid)
    if not summary["meta"]:
        return None
    ids = await store.chunk_ids(cid)
    chunks = [chunk_view(c, cfg.chunk_seconds, cfg.confidence) for c in await store.chunks(cid, ids)]
    reported = None
    if chunks:
        reported = chunks[-1]
        if reported["estimate"] is None and len(chunks) > 1 and chunks[-2]["estimate"] is not None:
            reported = chunks[-2]
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
        "labels_by_outcome": {o: int(counters.get(f"labels_{o}", 0))
                              for o in ("accepted", "skipped", "duplicate", "unknown", "expired")},
    }
    base = reported or {"estimate": None, "ci_lower": None, "ci_upper": None, "stderr": None, "labels": 0,
                        "population": 0, "chunk": None, "strata": [], "rounds": 0, "status": "open"}
    doc.update({k: base[k] for k in ("estimate", "ci_lower", "ci_upper", "stderr", "labels", "population", "chunk",
                                     "strata", "rounds", "status")})
    doc["history"] = [c for c in chunks if c is not reported]
    return doc
