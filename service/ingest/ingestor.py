"""Apply a partition's batch of parsed scores to Redis, exactly once.

Per classifier in the batch: skip records at or below the classifier's last
applied offset for this partition (a replay after a crash), make sure every
event-time chunk the records fall in has its strata boundaries (fixed once,
when the chunk opens, see `opening_histogram`), aggregate with numpy and apply with
one INGEST script call per classifier, all in one pipeline.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

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


@dataclass
class PreparedBatch:
    """A partition batch aggregated into INGEST calls, ready to `submit`."""

    partition: int
    calls: list[tuple]  # (records, (cid, partition, expected_offset, new_offset, payload))


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
        return await self.submit(await self.prepare(partition, offsets, classifier_ids, item_ids, scores, positive,
                                                    event_ms, contexts))

    async def prepare(self, partition: int, offsets, classifier_ids, item_ids, scores, positive, event_ms,
                      contexts, reload_offsets: bool = False) -> "PreparedBatch":
        """Aggregate a batch into INGEST calls (CPU work; Redis only on a cache miss).

        Each call expects the classifier's stored offset to be the one this
        instance last wrote or predicted; `prepare` then predicts the call's own
        new offset, so the next batch can be prepared while this one is still
        being applied.  A wrong prediction only makes the INGEST script refuse
        (compare-and-set), and `submit` re-aggregates from the stored offset.

        `reload_offsets` (a retry after a Redis failure) ignores predictions:
        they may come from a later batch prepared meanwhile, and filtering this
        batch's records against them would drop records never applied."""
        groups = group_by_classifier(offsets, classifier_ids, item_ids, scores, positive, event_ms, contexts)
        return PreparedBatch(partition, await self._calls(partition, groups, reload_offsets))

    async def submit(self, prepared: "PreparedBatch") -> int:
        """Apply prepared calls in one pipeline; re-aggregate where the offset guard refused."""
        counted = 0
        partition, calls = prepared.partition, prepared.calls
        while calls:
            results = await self.store.apply_ingest([c for _, c in calls])
            todo = []
            for (r, call), (applied, stored, cutoffs) in zip(calls, results):
                key = (r.classifier_id, partition)
                self._note_cutoffs(r.classifier_id, cutoffs)
                if applied:
                    counted += r.size
                    self._offsets[key] = max(self._offsets.get(key, -1), stored)
                else:  # another writer moved the offset (or a prediction was wrong): start from it
                    self._offsets[key] = stored
                    todo.append(r)
            calls = await self._calls(partition, todo) if todo else []
        return counted

    async def _calls(self, partition: int, groups: list[ClassifierRecords], reload: bool = False) -> list[tuple]:
        need = [g.classifier_id for g in groups if reload or (g.classifier_id, partition) not in self._offsets]
        stored = await self.store.scores_offsets(need, partition) if need else {}
        self._offsets.update({(cid, partition): off for cid, off in stored.items()})
        # this batch's own view of the offsets: awaits above let other batches update the cache
        expected = {g.classifier_id: stored.get(g.classifier_id, self._offsets.get((g.classifier_id, partition), -1))
                    for g in groups}
        fresh = [r for r in (g.after(expected[g.classifier_id]) for g in groups) if r.size]
        if not fresh:
            return []
        await self._ensure_chunks(fresh)
        now_ms = int(time.time() * 1000)
        calls = []
        for r in fresh:
            cid = r.classifier_id
            cfg = self.settings.for_classifier(cid)
            payload = build_payload(r, cfg.chunk_seconds, lambda t, c=cid: self._cuts[(c, t)],
                                    cfg.reservoir_size, now_ms, self.rng, lambda t, c=cid: self._cutoffs.get((c, t)))
            new = int(r.offsets[-1])
            calls.append((r, (cid, partition, expected[cid], new, orjson.dumps(payload))))
            self._offsets[(cid, partition)] = new  # predicted; corrected by `submit` if refused
        return calls

    def _note_cutoffs(self, cid: str, cutoffs) -> None:
        for t, k, cutoff in cutoffs:
            cut = self._cutoffs.get((cid, t))
            if cut is None:
                cut = self._cutoffs[(cid, t)] = np.full(self._cuts[(cid, t)].size + 1, np.inf)
            if k < cut.size:
                cut[k] = min(cut[k], cutoff)

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
