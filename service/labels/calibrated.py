"""Precision's difference estimator for one chunk of the service: the labelled items LABEL
keeps (``c:<t>:labelled``: stratum, label and score of each) and the chunk's score histogram,
read in one round trip and handed to `stats.difference.calibrated_interval` (the switch: the
plain estimator below ``CALIBRATION_MIN_LABELS`` labels, else the difference estimator while
its cross-fitted variance is no larger than the plain one's).

A label's cross-fitting fold is the parity of its request id's CRC-32 (request ids end in 16
random bytes): fixed for the label's life, so a chunk's figures do not move between reads,
and each fold is about half the labels."""

from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

from ..state.records import ChunkState, LabelledRecords
from ..state.store import Store
from ..stats.calibration import resolve_kind
from ..stats.difference import Calibrated, Labelled, StratumGrid, calibrated_interval, feature
from ..stats.sketch import ScoreHistogram


#: Chunks whose labelled items this process keeps between reads (a scrape reads only the histogram
#: again while a chunk's label count is unchanged): at most 4,096 labels of 11 bytes each per entry.
CACHED_CHUNKS = 1024
_labelled: OrderedDict[tuple, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = OrderedDict()


def fold_of(request_id: str) -> int:
    """The cross-fitting fold (0 or 1) of the label answering `request_id`."""
    return zlib.crc32(request_id.encode()) & 1


async def chunk_calibration(store: Store, state_id: str, cs: ChunkState, cfg, fpc: bool) -> Calibrated | None:
    """The chunk's `Calibrated` precision interval, or None where the plain estimator is all
    there is to report: the calibration is off (``CALIBRATION_MIN_LABELS`` 0), the chunk has
    fewer labels than that, no score range, or labelled records that do not add up to its
    label counts (labels folded before the records were kept)."""
    min_labels = int(cfg.calibration_min_labels)
    if not min_labels or cs.n.sum() < min_labels or not (np.isfinite(cs.min) and np.isfinite(cs.max)):
        return None
    key = (store.keys.prefix, state_id, cs.chunk, int(cs.n.sum()), int(cs.h.sum()))
    cached = _labelled.get(key)
    if cached is None:
        counts, rec = await store.chunk_labelled(state_id, cs.chunk)
        if not _adds_up(rec, cs):
            return None
        cached = (rec.stratum.astype(np.int8), rec.label.astype(np.int8), rec.score,
                  np.array([fold_of(r) for r in rec.request_ids], dtype=np.int8))
        _labelled[key] = cached
        if len(_labelled) > CACHED_CHUNKS:
            _labelled.popitem(last=False)
    else:
        _labelled.move_to_end(key)
        counts = await store.chunk_histogram(state_id, cs.chunk)
    if not counts.any():
        return None
    stratum, label, score, fold = cached
    kind = resolve_kind(cfg.score_kind, cs.min, cs.max)
    grid = StratumGrid.from_histogram(ScoreHistogram(counts=counts, min=cs.min, max=cs.max), cs.cuts, kind)
    return calibrated_interval(cs.N, Labelled(stratum, feature(score, kind), label, fold), grid, cfg.confidence, fpc,
                               min_labels)


def _adds_up(rec: LabelledRecords, cs: ChunkState) -> bool:
    """The records are every label the chunk's counts hold, stratum by stratum."""
    k = cs.strata
    return (not rec.unreadable and rec.stratum.size == int(cs.n.sum())
            and not (rec.stratum.size and (rec.stratum.min() < 0 or rec.stratum.max() >= k))
            and np.array_equal(np.bincount(rec.stratum, minlength=k), cs.n)
            and np.array_equal(np.bincount(rec.stratum, weights=rec.label, minlength=k), cs.h))


def calibration_doc(c: Calibrated | None) -> dict | None:
    """``{intercept, slope, labels_used, active}`` for `/v1/classifiers/{id}` (None: no calibration)."""
    if c is None:
        return None
    return {"intercept": c.calibration.intercept, "slope": c.calibration.slope, "labels_used": c.labels_used,
            "active": c.active}
