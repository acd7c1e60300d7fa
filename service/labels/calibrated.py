"""The difference estimator for one chunk of the service: the labelled items LABEL keeps
(``c:<t>:labelled``: stratum, label and score of each) and the chunk's score histogram, of each
side the classifier samples (its predicted positives; also its predicted negatives when its
metrics need them), read in one round trip a side and handed to
`stats.difference.calibrated_metrics` (per metric, the switch: the plain estimator below
``CALIBRATION_MIN_LABELS`` labels, else the difference estimator while its cross-fitted variance
is no larger than the plain one's; one calibration across both sides).

A label's cross-fitting fold is the parity of its request id's CRC-32 (request ids end in 16
random bytes): fixed for the label's life, so a chunk's figures do not move between reads,
and each fold is about half the labels."""

from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

from ..state.chunk_store import ChunkStore
from ..state.records import ChunkState, LabelledRecords
from ..stats.calibration import resolve_kind
from ..stats.difference import Calibrated, Labelled, StratumGrid, calibrated_metrics, feature
from ..stats.sketch import ScoreHistogram


#: Chunks whose labelled items this process keeps between reads (a scrape reads only the histogram
#: again while a chunk's label count is unchanged): one entry a chunk and side, its labels at 11 bytes
#: each.
CACHED_CHUNKS = 1024
_labelled: OrderedDict[tuple, tuple[tuple[int, int], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = \
    OrderedDict()


def fold_of(request_id: str) -> int:
    """The cross-fitting fold (0 or 1) of the label answering `request_id`."""
    return zlib.crc32(request_id.encode()) & 1


async def chunk_calibration(store: ChunkStore, state_id: str, cs: ChunkState, cfg, fpc: bool) -> Calibrated | None:
    """Precision's `Calibrated` interval of the chunk of one side (`chunk_calibrations`)."""
    found = await chunk_calibrations(store, [(state_id, cs, True)], cfg, fpc, ("precision",))
    return None if found is None else found["precision"]


async def chunk_calibrations(store: ChunkStore, sides: list[tuple[str, ChunkState | None, bool]], cfg, fpc: bool,
                             metrics) -> dict[str, Calibrated] | None:
    """Per metric, the chunk's `Calibrated` interval over the strata of `sides` ((state id, its chunk
    or None when the side has no item yet, whether it holds the predicted positives), in stratum
    order), or None where the plain estimators are all there is to report: the calibration is off
    (``CALIBRATION_MIN_LABELS`` 0), the chunk has fewer labels than that, no score range, or a
    side's labelled records do not add up to its label counts (labels folded before the records
    were kept)."""
    min_labels = int(cfg.calibration_min_labels)
    live = [cs for _, cs, _ in sides if cs is not None]
    if not min_labels or sum(int(cs.n.sum()) for cs in live) < min_labels:
        return None
    lo, hi = min(cs.min for cs in live), max(cs.max for cs in live)
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return None
    kind = resolve_kind(cfg.score_kind, lo, hi)
    parts, grids, first = [], [], 0
    for state_id, cs, _ in sides:
        if cs is None:
            grids.append(StratumGrid(np.zeros((1, 1)), np.zeros((1, 1))))
            first += 1
            continue
        found = await _side_items(store, state_id, cs)
        if found is None:
            return None
        counts, (stratum, label, score, fold) = found
        grids.append(StratumGrid.from_histogram(ScoreHistogram(counts=counts, min=cs.min, max=cs.max), cs.cuts, kind)
                     if counts.any() else StratumGrid(np.zeros((cs.strata, 1)), np.zeros((cs.strata, 1))))
        parts.append((stratum.astype(np.int64) + first, label, feature(score, kind), fold))
        first += cs.strata
    if not any(g.counts.any() for g in grids):
        return None
    N = np.concatenate([cs.N if cs is not None else np.zeros(1) for _, cs, _ in sides])
    positive = np.concatenate([np.full(cs.strata if cs is not None else 1, pos) for _, cs, pos in sides])
    stratum, label, x, fold = (np.concatenate(col) for col in zip(*parts))
    return calibrated_metrics(N, positive, Labelled(stratum, x, label, fold), StratumGrid.stack(grids), tuple(metrics),
                              cfg.confidence, fpc, min_labels)


async def _side_items(store: ChunkStore, state_id: str, cs: ChunkState):
    """(histogram counts, (stratum, label, score, fold) of each label) of one side's chunk, the
    labelled items kept in process by label count; None if they do not add up."""
    key, version = (store.keys.prefix, state_id, cs.chunk), (int(cs.n.sum()), int(cs.h.sum()))
    found = _labelled.get(key)
    if found is None or found[0] != version:  # replaced, not added beside: a chunk's labels grow one by one
        counts, rec = await store.chunk_labelled(state_id, cs.chunk)
        if not _adds_up(rec, cs):
            return None
        # the score copied out of the parsed table, which would otherwise stay alive behind the view
        cached = (rec.stratum.astype(np.int8), rec.label.astype(np.int8), rec.score.copy(),
                  np.array([fold_of(r) for r in rec.request_ids], dtype=np.int8))
        _labelled[key] = (version, cached)
        if len(_labelled) > CACHED_CHUNKS:
            _labelled.popitem(last=False)
    else:
        cached = found[1]
        counts = await store.chunk_histogram(state_id, cs.chunk)
    _labelled.move_to_end(key)
    return counts, cached


def _adds_up(rec: LabelledRecords, cs: ChunkState) -> bool:
    """The records are every label the chunk's counts hold, stratum by stratum."""
    k = cs.strata
    return (not rec.unreadable and rec.stratum.size == int(cs.n.sum())
            and not (rec.stratum.size and (rec.stratum.min() < 0 or rec.stratum.max() >= k))
            and np.array_equal(np.bincount(rec.stratum, minlength=k), cs.n)
            and np.array_equal(np.bincount(rec.stratum, weights=rec.label, minlength=k), cs.h))


def calibration_doc(c: dict[str, Calibrated] | Calibrated | None) -> dict | None:
    """``{intercept, slope, labels_used, active, active_metrics}`` for `/v1/classifiers/{id}` (None:
    no calibration): the Platt fit on every label, and the metrics whose reported interval is the
    difference estimator's (``active``: any)."""
    if c is None:
        return None
    by_metric = c if isinstance(c, dict) else {"precision": c}
    first = next(iter(by_metric.values()))
    active = [m for m, one in by_metric.items() if one.active]
    return {"intercept": first.calibration.intercept, "slope": first.calibration.slope,
            "labels_used": first.labels_used, "active": bool(active), "active_metrics": active}
