"""Apply a partition's batch of parsed scores to Redis, exactly once.

Per classifier in the batch: skip records at or below the classifier's last
applied offset for this partition (a replay after a crash), make sure every
event-time chunk the records fall in has its strata boundaries (fixed once,
when the chunk opens, see `opening_histogram`), aggregate with numpy and apply with
one INGEST script call per classifier, all in one pipeline.

Predicted negatives: for a classifier whose metrics need them (recall, F1,
accuracy) the same records go a second time, with the decision inverted, to
the state of its predicted negatives (`state.keys.negatives_of`): their own
chunks, strata, reservoirs and offsets, so every guarantee below holds for
them unchanged.  A classifier whose metrics need none has its calls marked
`unpaired`: INGEST keeps the latest event time they counted, up to which the
negatives' chunks miss records should those metrics be enabled later.

Strata from the start: a chunk whose opening histogram (the opening batch,
merged with the previous chunk's when that batch is small) holds fewer than
`provisional_cap` predicted positives (25 per stratum) opens *provisional*:
one stratum, every item in its reservoir (the cap is at most the reservoir
size) and its exact scores kept.  The batch that would bring it to the cap is
refused by INGEST; the ingestor then re-stratifies the chunk (RESTRATIFY: cuts
from the chunk's histogram plus the batch, N recomputed from the exact scores,
reservoir members moved to their strata, cuts version incremented) and
re-aggregates the batch with the new cuts.  Payloads carry the cuts version they
were built with and INGEST refuses a stale one, so an instance whose cached
cuts another instance replaced reloads them and nothing is counted twice or in
the wrong stratum.  The request loop does not sample a provisional chunk; one that
closes provisional it keeps in its one stratum for good (FREEZE) and samples.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import numpy as np

from ..stats.sketch import ScoreHistogram
from ..stats.strata import boundaries
from ..state.calls import IngestCall, IngestRefusal
from ..state.keys import ingest_chunks, negatives_of, owner_of
from ..state.offsets import Acknowledged, RestartedLogs, check_not_rolled_back
from ..state.records import ChunkCuts
from ..state.scripts import encode_ingest
from ..state.store import Store
from .aggregate import ClassifierRecords, build_payload, group_by_classifier, positives_by_chunk
from .bins import ChunkBins


#: Predicted positives per stratum the opening batch needs to set a chunk's boundaries alone.
OPENING_ITEMS_PER_STRATUM = 25


def provisional_cap(strata: int, reservoir_size: int) -> int:
    """Predicted positives at which a provisional chunk gets its strata: 25 per stratum,
    or the reservoir size if smaller (a provisional chunk must hold every item in its one
    reservoir, so that re-assigning the members gives every stratum a uniform sample).
    0 for one stratum (never provisional)."""
    if strata <= 1:
        return 0
    return min(OPENING_ITEMS_PER_STRATUM * strata, int(reservoir_size))


def opening_histogram(batch: ScoreHistogram, previous: ScoreHistogram | None, strata: int) -> ScoreHistogram:
    """The score distribution a new chunk's boundaries are computed from.

    The most recent scores are the opening batch's own; when it holds enough
    of them (25 per stratum) they alone set the boundaries, so a shift in the
    score distribution moves the boundaries of the very chunk where it shows.
    A smaller opening batch is merged with the previous chunk's histogram.
    When the result still holds fewer than `provisional_cap` scores (a new
    classifier, or a slow stream) the chunk opens provisional instead.
    """
    if previous is None or batch.total >= OPENING_ITEMS_PER_STRATUM * strata:
        return batch
    return previous.merge(batch)


@dataclass
class PreparedBatch:
    """A partition batch aggregated into INGEST calls, ready to `submit`."""

    partition: int
    calls: list[tuple[ClassifierRecords, IngestCall]]  # the records each call aggregates


class ScoreIngestor:
    """Applies partition batches of scores (see the module's doc).  Of `store` it uses the chunks
    (`state.chunk_store.ChunkStore`: strata, histograms, INGEST) and the offsets
    (`state.offset_store.OffsetStore`: INGEST's stored offsets)."""

    def __init__(self, store: Store, settings, rng: np.random.Generator | None = None) -> None:
        self.chunks, self.offsets = store.chunks, store.offsets
        self.settings = settings
        self.rng = rng or np.random.default_rng()
        self._offsets: dict[tuple[str, int], int] = {}
        self.acknowledged = Acknowledged("scores")  # (cid, partition) -> the offset Redis last applied for us
        # (cid, chunk) -> its stored cuts; replaced only through the INGEST cuts guard
        self._cuts: dict[tuple[str, int], ChunkCuts] = {}
        # (cid, chunk) -> per stratum its full reservoir's cutoff (INGEST: the larger of the
        # largest priority kept and the stratum's threshold; inf: not full or not known).
        # Only ever decreases, so a stale value is merely less selective.
        self._cutoffs: dict[tuple[str, int], np.ndarray] = {}
        # (cid, chunk) -> this instance's copy of its histogram counters, updated as each call is
        # prepared (so ahead of Redis while calls are in flight); dropped where a call was refused,
        # and INGEST refuses a call made from a copy that does not match (IngestRefusal.BINS_CHANGED)
        self._bins: dict[tuple[str, int], ChunkBins] = {}
        self._oldest_open = -1  # chunks before it have closed: `forget_closed_chunks`
        self._restarted = RestartedLogs("scores")
        self._log_ends: dict[object, int | None] = {}  # partition -> its end offset at the last fetch (`prepare`)

    def forget_closed_chunks(self, oldest_open: int) -> None:
        """Drop the cached cuts, cutoffs and histograms of the chunks before `oldest_open`: closed,
        no score reaches them any more (so the caches hold the open chunks' entries, not one per
        classifier and chunk for good).  Scans the caches once per new chunk."""
        if oldest_open <= self._oldest_open:
            return
        self._oldest_open = oldest_open
        for key in {k for cache in (self._cuts, self._cutoffs, self._bins) for k in cache if k[1] < oldest_open}:
            self._forget_chunk(*key)

    def forget_partition(self, partition: int) -> None:
        """Drop cached offsets of a partition this instance no longer owns."""
        for key in [k for k in self._offsets if k[1] == partition]:
            del self._offsets[key]
        self.acknowledged.forget_partition(partition)
        self._log_ends.pop(partition, None)

    async def apply(self, partition: int, offsets, classifier_ids, item_ids, scores, positive, event_ms,
                    contexts) -> int:
        """Apply the batch; returns the number of records newly counted."""
        return await self.submit(await self.prepare(partition, offsets, classifier_ids, item_ids, scores, positive,
                                                    event_ms, contexts))

    async def prepare(self, partition: int, offsets, classifier_ids, item_ids, scores, positive, event_ms,
                      contexts, reload_offsets: bool = False, log_end: int | None = None) -> "PreparedBatch":
        """Aggregate a batch into INGEST calls (CPU work; Redis only on a cache miss).

        Each call expects the classifier's stored offset to be the one this
        instance last wrote or predicted; `prepare` then predicts the call's own
        new offset, so the next batch can be prepared while this one is still
        being applied.  A wrong prediction only makes the INGEST script refuse
        (compare-and-set), and `submit` re-aggregates from the stored offset.

        `reload_offsets` (a retry after a Redis failure) ignores predictions:
        they may come from a later batch prepared meanwhile, and filtering this
        batch's records against them would drop records never applied.
        `log_end`: the partition's end offset as the fetch reported it (kept for `_unapplied`).

        It yields to the event loop first and after each classifier's aggregation: the
        consume pipeline stages a poll while the previous poll is applied, and without
        yields the apply task (created just before) would not send its Redis calls until
        the whole poll was staged, so Redis and this CPU work would take turns instead of
        overlapping.  (So a batch may be prepared between another's refusal and its redo:
        `submit` redoes from the offsets the refusals report, never from the cache.)"""
        await asyncio.sleep(0)
        if reload_offsets:  # the failed calls may or may not have applied what the copies hold
            self._bins.clear()
        groups = group_by_classifier(offsets, classifier_ids, item_ids, scores, positive, event_ms, contexts)
        groups += [g.negatives(negatives_of(g.classifier_id)) for g in groups
                   if self.settings.samples_negatives(g.classifier_id)]
        self._log_ends[partition] = log_end
        return PreparedBatch(partition, await self._calls(partition, groups, reload_offsets))

    async def submit(self, prepared: "PreparedBatch") -> int:
        """Apply prepared calls in one pipeline; re-aggregate where the offset guard refused."""
        counted = 0
        partition, calls = prepared.partition, prepared.calls
        while calls:
            replies = await self.chunks.apply_ingest([c for _, c in calls])
            todo, restratify, base = [], [], {}
            for (r, call), reply in zip(calls, replies):
                key, stored = (r.classifier_id, partition), reply.stored_offset
                self._note_cutoffs(r.classifier_id, reply.cutoffs)
                if reply.applied:
                    counted += 0 if owner_of(r.classifier_id)[1] else r.size  # each record once
                    self._offsets[key] = max(self._offsets.get(key, -1), stored)
                    self.acknowledged.note(r.classifier_id, partition, stored)
                else:  # another writer moved the offset (or a prediction was wrong): start from it
                    check_not_rolled_back(f"classifier {r.classifier_id!r}, scores partition {partition}", stored,
                                          self.acknowledged.get(key, -1))
                    self._offsets[key] = stored
                    for t, _ in call.chunks:  # the copies hold this call's counts, never applied
                        self._bins.pop((r.classifier_id, int(t)), None)
                    for t, reason in reply.refused:  # or a chunk guard: reload its cuts, re-stratify first
                        if reason != IngestRefusal.BINS_CHANGED:
                            self._forget_chunk(r.classifier_id, t)
                        if reason == IngestRefusal.RESTRATIFY_FIRST:
                            restratify.append((r, t))
                    todo.append(r)
                    base[r.classifier_id] = stored
            for r, t in restratify:
                await self._restratify(r, t)
            # from the offsets the refusals reported, not from the cache: a later batch prepared
            # meanwhile may have put its own predictions there
            calls = await self._calls(partition, todo, base=base) if todo else []
        return counted

    async def _calls(self, partition: int, groups: list[ClassifierRecords], reload: bool = False,
                     base: dict[str, int] | None = None) -> list[tuple[ClassifierRecords, IngestCall]]:
        """The INGEST calls of `groups`, each expecting the stored offset `base` gives for its
        classifier or, without `base`, the cached (written or predicted) one, loaded on a miss
        (and always with `reload`)."""
        if base is not None:
            return await self._payloads(partition, groups, base)
        need = [g.classifier_id for g in groups if reload or (g.classifier_id, partition) not in self._offsets]
        stored = await self.offsets.scores_offsets(need, partition) if need else {}
        for cid, off in stored.items():  # a retry after an outage reloads them: Redis may have gone back
            check_not_rolled_back(f"classifier {cid!r}, scores partition {partition}", off,
                                  self.acknowledged.get((cid, partition), -1))
        self._offsets.update({(cid, partition): off for cid, off in stored.items()})
        # this batch's own view of the offsets: awaits above let other batches update the cache
        expected = {g.classifier_id: stored.get(g.classifier_id, self._offsets.get((g.classifier_id, partition), -1))
                    for g in groups}
        return await self._payloads(partition, groups, expected)

    async def _payloads(self, partition: int, groups: list[ClassifierRecords], expected: dict[str, int]
                        ) -> list[tuple[ClassifierRecords, IngestCall]]:
        """Aggregate the records of each group not applied yet (`_unapplied`) into an INGEST call,
        and predict the call's new offset."""
        fresh = [r for r in (self._unapplied(g, expected[g.classifier_id], partition) for g in groups) if r.size]
        if not fresh:
            return []
        cuts = await self._ensure_chunks(fresh)
        bins = await self._ensure_bins(list(cuts))
        now_ms = int(time.time() * 1000)
        calls = []
        for r in fresh:
            cid = r.classifier_id
            cfg = self.settings.for_classifier(cid)
            payload = build_payload(r, cfg.chunk_seconds, lambda t, c=cid: cuts[(c, t)],
                                    cfg.reservoir_size, now_ms, self.rng, lambda t, c=cid: self._cutoffs.get((c, t)),
                                    provisional_cap(cfg.strata, cfg.reservoir_size), lambda t, c=cid: bins[(c, t)],
                                    self.settings.sharing_group_of(cid))
            if not owner_of(cid)[1] and not self.settings.samples_negatives(cid):
                payload["unpaired"] = True  # INGEST notes how far its negatives' state misses records
            new = int(r.offsets[-1])
            calls.append((r, IngestCall(cid, partition, expected[cid], new, encode_ingest(payload),
                                        ingest_chunks(payload))))
            self._offsets[(cid, partition)] = new  # predicted; corrected by `submit` if refused
            await asyncio.sleep(0)  # see `prepare`
        return calls

    def _unapplied(self, records: ClassifierRecords, stored: int, partition) -> ClassifierRecords:
        """The records above the `stored` offset: those at or below it were applied (a replay, or
        a log that started again: `state.offsets`)."""
        if records.size and records.offsets[0] <= stored:
            self._restarted.check(records.classifier_id, partition, stored, self._log_ends.get(partition))
        return records.after(stored)

    def _note_cutoffs(self, cid: str, cutoffs) -> None:
        for t, k, cutoff in cutoffs:
            cut = self._cutoffs.get((cid, t))
            if cut is None:
                stored = self._cuts.get((cid, t))
                if stored is None:  # forgotten meanwhile (cuts reloading): merely less selective
                    continue
                cut = self._cutoffs[(cid, t)] = np.full(stored.cuts.size + 1, np.inf)
            if k < cut.size:
                cut[k] = min(cut[k], cutoff)

    def _forget_chunk(self, cid: str, t: int) -> None:
        """Drop a chunk's cached cuts, reservoir cutoffs and histogram: reloaded when next needed."""
        for cache in (self._cuts, self._cutoffs, self._bins):
            cache.pop((cid, t), None)

    async def _ensure_bins(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], ChunkBins]:
        """This instance's copy of each chunk's histogram counters, read from Redis where it has
        none (a chunk opened, a call refused); returned as a snapshot, like `_ensure_chunks`."""
        need = [k for k in keys if k not in self._bins]
        if need:
            for key, packed in (await self.chunks.chunk_bins(need)).items():
                self._bins.setdefault(key, ChunkBins(packed))
        return {k: self._bins[k] for k in keys}

    async def _restratify(self, r: ClassifierRecords, t: int) -> None:
        """Give provisional chunk `t` its strata: cuts from its histogram plus this batch's
        items in it (the same stratification as any chunk), applied by RESTRATIFY unless
        another instance did it first (the version check inside the script)."""
        cid = r.classifier_id
        cfg = self.settings.for_classifier(cid)
        cur = (await self.chunks.chunk_strata([(cid, t)]))[(cid, t)]
        if cur is None or not cur.provisional:
            return
        positions = dict(positives_by_chunk(r, cfg.chunk_seconds)).get(t, np.empty(0, dtype=np.int64))
        hist = ScoreHistogram.from_scores(r.score[positions])
        stored = await self.chunks.chunk_score_histogram(cid, t)
        if stored is not None:
            hist = stored.merge(hist)
        cuts = boundaries(hist, cfg.strata, cfg.stratification, cfg.score_kind)
        await self.chunks.restratify(cid, t, cur.version, cuts)

    async def _ensure_chunks(self, recs: list[ClassifierRecords]) -> dict[tuple[str, int], ChunkCuts]:
        """The stored cuts of every chunk the records' predicted positives fall in, opening
        the chunks that are new; cached, and returned as a snapshot (the cache may change
        while another batch of this instance is submitted)."""
        out: dict[tuple[str, int], ChunkCuts] = {}
        need: dict[tuple[str, int], np.ndarray] = {}  # a new chunk's scores: its opening batch's
        for r in recs:
            cfg = self.settings.for_classifier(r.classifier_id)
            for t, positions in positives_by_chunk(r, cfg.chunk_seconds):
                key = (r.classifier_id, t)
                if key in self._cuts:
                    out[key] = self._cuts[key]
                else:
                    need[key] = r.score[positions]
        if not need:
            return out
        stored = await self.chunks.chunk_strata(list(need))
        for key, cuts in stored.items():
            if cuts is None:
                cid, t = key
                cfg = self.settings.for_classifier(cid)
                hist = opening_histogram(ScoreHistogram.from_scores(need[key]),
                                         await self.chunks.recent_histogram(cid, t), cfg.strata)
                now_ms = int(time.time() * 1000)
                if hist.total < provisional_cap(cfg.strata, cfg.reservoir_size):
                    cuts = await self.chunks.open_chunk(cid, t, np.empty(0), now_ms, cfg.reservoir_size,
                                                        provisional=True)
                else:
                    cuts = await self.chunks.open_chunk(
                        cid, t, boundaries(hist, cfg.strata, cfg.stratification, cfg.score_kind), now_ms,
                        cfg.reservoir_size)
            out[key] = cuts
            cached = self._cuts.get(key)
            if cached is None or cached.version <= cuts.version:
                self._cuts[key] = cuts
        return out
