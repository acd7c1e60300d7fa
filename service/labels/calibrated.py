"""Precision's difference estimator for one chunk of the service: the labelled items LABEL
keeps (``c:<t>:labelled``: stratum, label and score of each) and the chunk's score histogram,
read in one round trip and handed to `stats.difference.calibrated_interval` (the switch: the
plain estimator below ``CALIBRATION_MIN_LABELS`` labels, else the difference estimator while
its cross-fitted variance beats the plain one's by a margin).

A label's cross-fitting fold is the parity of its request id's CRC-32 (request ids end in 16
random bytes): fixed for the label's life, so a chunk's figures do not move between reads,
and each fold is about half the labels."""

from __future__ import annotations

import zlib

import numpy as np

from ..state.records import ChunkState
from ..state.store import Store
from ..stats.calibration import resolve_kind
from ..stats.difference import Calibrated, Labelled, StratumGrid, calibrated_interval, feature
from ..stats.sketch import ScoreHistogram


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
    counts, rec = await store.chunk_labelled(state_id, cs.chunk)
    k = cs.strata
    if (not counts.any() or rec.unreadable or rec.stratum.size != int(cs.n.sum())
            or (rec.stratum.size and (rec.stratum.min() < 0 or rec.stratum.max() >= k))
            or not np.array_equal(np.bincount(rec.stratum, minlength=k), cs.n)
            or not np.array_equal(np.bincount(rec.stratum, weights=rec.label, minlength=k), cs.h)):
        return None
    kind = resolve_kind(cfg.score_kind, cs.min, cs.max)
    grid = StratumGrid.from_histogram(ScoreHistogram(counts=counts, min=cs.min, max=cs.max), cs.cuts, kind)
    items = Labelled(rec.stratum, feature(rec.score, kind), rec.label,
                     np.array([fold_of(r) for r in rec.request_ids], dtype=np.int64))
    return calibrated_interval(cs.N, items, grid, cfg.confidence, fpc, min_labels)


def calibration_doc(c: Calibrated | None) -> dict | None:
    """``{intercept, slope, labels_used, active}`` for `/v1/classifiers/{id}` (None: no calibration)."""
    if c is None:
        return None
    return {"intercept": c.calibration.intercept, "slope": c.calibration.slope, "labels_used": c.labels_used,
            "active": c.active}
