"""One partition batch of the scores or labels topic: staged (parsed and, for scores,
aggregated into INGEST calls) and applied (the classifiers' state, the service-wide
counts, the dead letters).  `checkpoint.Checkpoint` decides when each step runs and
what is committed; this module says what a step does."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np
from aiokafka import TopicPartition

from stratameter.schemas.messages import FOLDED_OUTCOMES, LABEL_OUTCOME_REJECTS
from stratameter.schemas.batches import ScoreBatch
from stratameter.schemas.inbound import parse_labels, parse_scores
from ..config import Settings
from ..ingest.admission import ClassifierAdmission
from ..ingest.ingestor import PreparedBatch, ScoreIngestor
from ..labels.folder import LabelFolder
from ..state.keys import UNKNOWN_LABELS_SCOPE
from ..state.offset_store import OffsetStore
from ..state.offsets import Acknowledged, check_not_rolled_back
from ..state.process import ProcessState
from ..state.registry import Registry
from .deadletters import DeadLetters
from .failures import redis_outage
from .records import KafkaRecord

#: Dead-letter reasons of labels read but not folded (`LABEL_OUTCOME_REJECTS`): not invalid records.
_LABEL_REJECT_REASONS = frozenset(LABEL_OUTCOME_REJECTS.values())


def _offsets(records) -> np.ndarray:
    """Every record's offset.  A partition's offsets only increase, so a batch whose last is
    its first plus its length minus one holds consecutive offsets (the usual case)."""
    n = len(records)
    if not n:
        return np.empty(0, dtype=np.int64)
    first, last = records[0].offset, records[-1].offset
    if last - first == n - 1:
        return np.arange(first, last + 1, dtype=np.int64)
    return np.fromiter((r.offset for r in records), dtype=np.int64, count=n)


@dataclass
class StagedBatch:
    """A partition batch parsed, and for scores aggregated, but not applied."""

    offsets: np.ndarray  # every record's offset
    batch: object  # the parsed records (schemas.inbound)
    rejects: list  # (position, reason, detail) of each record to dead-letter
    prepared: PreparedBatch | None  # scores: the INGEST calls


class GlobalCounts:
    """Service-wide counts (invalid records per topic and reason, labels whose request id
    names no classifier), guarded per scope and partition by the offset stored beside them,
    like a classifier's state.  Caches the offsets it last stored (`forget` on rebalance)."""

    def __init__(self, offset_store: OffsetStore) -> None:
        self.offset_store = offset_store
        self.offsets: dict[tuple[str, int], int] = {}

    def forget(self) -> None:
        self.offsets.clear()

    async def add_invalid(self, topic: str, partition: int, by_offset: dict[int, str], last: int) -> None:
        """Count the rejected records (offset -> reason) of a batch ending at offset `last`."""
        await self._add(topic, partition, by_offset, last,
                        lambda: self.offset_store.invalid_offset(topic, partition),
                        lambda base, counts: self.offset_store.count_invalid(topic, partition, base, last, counts))

    async def add_unknown_labels(self, partition: int, offsets: list[int], last: int) -> None:
        """Count the labels (by offset) naming no classifier of a batch ending at offset `last`."""
        await self._add(UNKNOWN_LABELS_SCOPE, partition, dict.fromkeys(offsets, "unknown"), last,
                        lambda: self.offset_store.unknown_labels_offset(partition),
                        lambda base, counts: self.offset_store.count_unknown_labels(partition, base, last,
                                                                                    counts.get("unknown", 0)))

    async def _add(self, scope: str, partition: int, by_offset: dict[int, str], last: int,
                   read: Callable[[], Awaitable[int]],
                   write: Callable[[int, dict[str, int]], Awaitable[tuple[bool, int]]]) -> None:
        """Add the counts of the offsets above the stored one, and store `last`.

        A batch with nothing to count skips the call: the guard compares offsets
        (`off > stored`), so it need not advance over records it never counts."""
        if not by_offset:
            return
        key = (scope, partition)
        if key not in self.offsets:
            self.offsets[key] = await read()
        while self.offsets[key] < last:
            base = self.offsets[key]
            counts: dict[str, int] = defaultdict(int)
            for off, reason in by_offset.items():
                if off > base:
                    counts[reason] += 1
            _, self.offsets[key] = await write(base, dict(counts))
            check_not_rolled_back(f"service-wide counts {scope!r}, partition {partition}", self.offsets[key], base)


class BatchHandler:
    """Stages and applies partition batches (see `checkpoint.Checkpoint` for the order).
    `registry`: the classifiers there are (`ingest.admission`); `process`: the first topics
    (`offset_field`)."""

    def __init__(self, settings: Settings, ingestor: ScoreIngestor, folder: LabelFolder, counts: GlobalCounts,
                 dead_letters: DeadLetters, wake: asyncio.Event, registry: Registry, process: ProcessState) -> None:
        self.settings, self.ingestor, self.folder = settings, ingestor, folder
        self.counts, self.dead_letters, self.wake = counts, dead_letters, wake
        self.admission = ClassifierAdmission(registry, settings.max_classifiers)
        self.process = process

    def offset_field(self, tp: TopicPartition) -> int | str:
        """The name the state keeps a partition's last applied offset under (the offset guards of
        INGEST, LABEL and GLOBAL_COUNT): the partition number for the topics the state was first
        written from, ``<topic>:<partition>`` for any other.  Offsets count the records of one topic,
        and a new one (renamed, on another cluster) numbers its records from 0 again: under the
        old partition's offset its records read as replays and were dropped without a word."""
        scores, labels = self.process.first_topics or (self.settings.topic_scores, self.settings.topic_labels)
        return tp.partition if tp.topic in (scores, labels) else f"{tp.topic}:{tp.partition}"

    def acknowledged(self, tp: TopicPartition) -> tuple[Acknowledged, int | str]:
        """The offsets the guards of `tp`'s topic acknowledged (the ingestor's for scores, the label
        folder's for labels), and the name the states keep `tp`'s offset under (`offset_field`)."""
        side = self.ingestor.acknowledged if tp.topic == self.settings.topic_scores else self.folder.acknowledged
        return side, self.offset_field(tp)

    async def stage(self, tp: TopicPartition, records: Sequence[KafkaRecord], window: tuple[int, int],
                    retry: bool = False, log_end: int | None = None) -> StagedBatch | None:
        """Parse a partition batch; for scores also aggregate it into INGEST calls.
        `window`: the event times accepted (`Settings.event_time_window`); a score outside it is
        dead-lettered (``event_time_in_future`` / ``event_time_too_late``) and creates no chunk.
        None if Redis failed meanwhile (the batch is then staged again, `retry`, and re-raises).
        `log_end`: the partition's end offset as its fetch reported it (a log that started again,
        `ScoreIngestor.prepare`)."""
        values = [r.value for r in records]
        stamps = [r.timestamp for r in records]
        offsets = _offsets(records)
        if tp.topic != self.settings.topic_scores:
            batch, rejects = parse_labels(values, stamps)
            return StagedBatch(offsets, batch, list(rejects), None)
        batch, rejects = parse_scores(values, stamps, self.settings.threshold_for, window=window)
        rejects = list(rejects)
        self.ingestor.forget_closed_chunks(window[0] // (1000 * self.settings.chunk_seconds))
        prepared = None
        if batch.index.size:
            try:
                batch = await self._admitted(batch, rejects)
                if batch.index.size:
                    prepared = await self.ingestor.prepare(self.offset_field(tp), offsets[batch.index],
                                                           batch.classifier_id,
                                                           batch.item_id, batch.score, batch.predicted_positive,
                                                           batch.event_time_ms, batch.context, reload_offsets=retry,
                                                           log_end=log_end)
            except Exception as exc:
                if retry or not redis_outage(exc):
                    raise
                return None
        return StagedBatch(offsets, batch, rejects, prepared)

    async def _admitted(self, batch: ScoreBatch, rejects: list) -> ScoreBatch:
        """The batch without the records of new classifier ids beyond the cap (`ingest.admission`),
        which go to `rejects` (dead-lettered and counted, creating no state)."""
        refused = await self.admission.refused(batch.classifier_id)
        if not refused:
            return batch
        keep = np.fromiter((c not in refused for c in batch.classifier_id), dtype=bool, count=len(batch))
        cap = self.admission.cap
        for j in np.flatnonzero(~keep):
            rejects.append((int(batch.index[j]), "too_many_classifiers",
                            f"classifier_id {batch.classifier_id[j]!r} is new and {cap} classifiers exist "
                            f"(STRATAMETER_MAX_CLASSIFIERS)"))
        return batch.subset(keep)

    async def apply(self, tp: TopicPartition, records: Sequence[KafkaRecord], staged: StagedBatch,
                    log_end: int | None = None) -> None:
        """Apply a staged partition batch: state, service-wide counts, dead letters (acked).
        `log_end`: as for `stage`."""
        offsets, batch, rejects = staged.offsets, staged.batch, staged.rejects
        if staged.prepared is not None:
            await self.ingestor.submit(staged.prepared)
        elif tp.topic != self.settings.topic_scores and batch.index.size:
            await self._fold_labels(tp, staged, log_end)
        invalid = {int(offsets[i]): reason for i, reason, _ in rejects if reason not in _LABEL_REJECT_REASONS}
        await self.counts.add_invalid(tp.topic, tp.partition, invalid, int(offsets[-1]))
        await self.dead_letters.send(tp, records, rejects)

    async def _fold_labels(self, tp: TopicPartition, staged: StagedBatch, log_end: int | None) -> None:
        """Fold the labels; a label not folded (unknown request, duplicate, expired) is
        dead-lettered with its outcome, and one naming no classifier counted service-wide."""
        offsets, batch = staged.offsets, staged.batch
        outcomes = await self.folder.apply(self.offset_field(tp), offsets[batch.index], batch.request_id, batch.label,
                                           batch.labeler_id, log_end)
        unknown_global = []
        for o in outcomes:
            pos = int(batch.index[o.index])
            if o.outcome in LABEL_OUTCOME_REJECTS:
                staged.rejects.append((pos, LABEL_OUTCOME_REJECTS[o.outcome],
                                       f"label for request_id {batch.request_id[o.index]!r}: {o.outcome}"))
            if o.classifier_id == "":  # names no classifier: counted service-wide
                unknown_global.append(int(offsets[pos]))
            if o.outcome in FOLDED_OUTCOMES:
                self.wake.set()
        await self.counts.add_unknown_labels(self.offset_field(tp), unknown_global, int(offsets[-1]))
