"""Apply a partition's batch of parsed scores to Redis, exactly once.

Per classifier in the batch: skip records at or below the classifier's last
applied offset for this partition (a replay after a crash), make sure every
event-time chunk the records fall in has its strata boundaries (fixed once,
when the chunk opens, see `opening_histogram`), aggregate with numpy and apply with
one INGEST script call per classifier, all in one pipeline.
"""

from __future__ import annotations

import time

import numpy as np
import orjson

from ..stats.sketch import ScoreHistogram
from ..stats.strata import boundaries
from ..state.store import Store
from .aggregate import ClassifierRecords, build_payload, chunk_of, group_by_classifier


#: Predicted positives per stratum the opening batch needs to set a chunk's boundaries alone.
OPENING_ITEMS_PER_STRATUM = 25


def opening_histogram(batch: ScoreHistogram, previous: ScoreHistogram | None, strata: int) -> ScoreHistogram:
    """The score distribution a new chunk's boundaries are computed from.

    The most recent scores are the opening batch's own; when it holds enough
    of them (25 per stratum) they alone set the boundaries, so a shift in the
    score distribution moves the boundaries of the very chunk where it shows.
    A smaller opening batch is merged with the previous chunk's histogram.
    """
    if previous is None or batch.total >= OPENING_ITEMS_PER_STRATUM * strata:
        return batch
    return previous.merge(batch)


class ScoreIngestor:
    def __init__(self, store: Store, settings, rng: np.random.Generator | None = None) -> None:
        self.store = store
        self.settings = settings
        self.rng = rng or np.random.default_rng()
        self._offsets: dict[tuple[str, int], int] = {}
        self._cuts: dict[tuple[str, int], np.ndarray] = {}
        # (cid, chunk) -> per stratum the largest priority its full reservoir keeps (inf: not
        # full or not known).  Only ever decreases, so a stale value is merely less selective.
        self._cutoffs: dict[tuple[str, int], np.ndarray] = {}

    def forget_partition(self, partition: int) -> None:
        """Drop cached offsets of a partition this instance no longer owns."""
        for key in [k for k in self._offsets if k[1] == partition]:
            del self._offsets[key]

    async def apply(self, partition: int, offsets, classifier_ids, item_ids, scores, positive, event_ms,
                    contexts) -> int:
        """Apply the batch; returns the number of records newly counted."""
        groups = group_by_classifier(offsets, classifier_ids, item_ids, scores, positive, event_ms, contexts)
        unknown = [g.classifier_id for g in groups if (g.classifier_id, partition) not in self._offsets]
        if unknown:
            for cid, off in (await self.store.scores_offsets(unknown, partition)).items():
                self._offsets[(cid, partition)] = off
        counted = 0
        todo = groups
        while todo:
            fresh = [(g, g.after(self._offsets[(g.classifier_id, partition)])) for g in todo]
            fresh = [(g, r) for g, r in fresh if r.size]
            if not fresh:
                break
            await self._ensure_chunks([r for _, r in fresh])
            now_ms = int(time.time() * 1000)
            calls = []
            for _, r in fresh:
                cfg = self.settings.for_classifier(r.classifier_id)
                payload = build_payload(r, cfg.chunk_seconds, lambda t, c=r.classifier_id: self._cuts[(c, t)],
                                        cfg.reservoir_size, now_ms, self.rng,
                                        lambda t, c=r.classifier_id: self._cutoffs.get((c, t)))
                calls.append((r.classifier_id, partition, self._offsets[(r.classifier_id, partition)],
                              int(r.offsets[-1]), orjson.dumps(payload)))
            results = await self.store.apply_ingest(calls)
            todo = []
            for (g, r), (applied, stored, cutoffs) in zip(fresh, results):
                self._offsets[(r.classifier_id, partition)] = stored
                for t, k, cutoff in cutoffs:
                    cut = self._cutoffs.get((r.classifier_id, t))
                    if cut is None:
                        cut = self._cutoffs[(r.classifier_id, t)] = np.full(self._cuts[(r.classifier_id, t)].size + 1,
                                                                            np.inf)
                    if k < cut.size:
                        cut[k] = min(cut[k], cutoff)
                if applied:
                    counted += r.size
                else:  # another writer advanced the offset: re-aggregate what is left
                    todo.append(g)
        return counted

    async def _ensure_chunks(self, recs: list[ClassifierRecords]) -> None:
        need: dict[tuple[str, int], ClassifierRecords] = {}
        for r in recs:
            cfg = self.settings.for_classifier(r.classifier_id)
            for t in np.unique(chunk_of(r.event_ms[r.positive], cfg.chunk_seconds)):
                if (r.classifier_id, int(t)) not in self._cuts:
                    need[(r.classifier_id, int(t))] = r
        if not need:
            return
        stored = await self.store.chunk_cuts(list(need))
        for key, cuts in stored.items():
            if cuts is not None:
                self._cuts[key] = cuts
                continue
            cid, t = key
            cfg = self.settings.for_classifier(cid)
            r = need[key]
            sel = r.positive & (chunk_of(r.event_ms, cfg.chunk_seconds) == t)
            hist = opening_histogram(ScoreHistogram.from_scores(r.score[sel]),
                                     await self.store.recent_histogram(cid, t), cfg.strata)
            cuts = boundaries(hist, cfg.strata, cfg.stratification)
            self._cuts[key] = await self.store.open_chunk(cid, t, cuts, int(time.time() * 1000))
