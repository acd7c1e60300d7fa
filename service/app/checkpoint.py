"""The checkpoint: from a poll's records to committed Kafka offsets, exactly once."""

from __future__ import annotations

import asyncio
import logging

from aiokafka import TopicPartition
from aiokafka.structs import OffsetAndMetadata

from ..state.offset_store import OffsetStore
from ..state.offsets import StateRolledBack, applied_field
from .batch import BatchHandler, StagedBatch
from .consumer import KafkaClients
from .failures import describe_outage, redis_outage
from .lifecycle import pause
from .probes import Health

log = logging.getLogger(__name__)

BACKOFF_MAX_S = 5.0
COMMIT_INTERVAL_S = 0.2


class Checkpoint:
    """Stage, apply, commit: the one place where exactly-once is decided.

    1. `stage`: parse each partition batch of a poll and, for scores, aggregate it into
       INGEST calls (CPU work).  Staging reads Redis (the classifiers there are, the states'
       stored offsets, the chunks' strata and histograms) and writes one thing: a chunk the
       batch is the first to reach is opened with its strata (OPEN_CHUNK, in
       `ScoreIngestor.prepare`).  That write counts nothing and moves no offset: the first
       opener's cuts win and every later one (a retry, another instance, the next poll) reads
       them, and a chunk opened by a batch not applied yet holds no data and is listed by no
       reader until an INGEST adds to it.  So the next poll can be staged while the previous
       one is applied.
    2. `apply`: apply each staged partition batch (`batch.BatchHandler.apply`): the
       classifiers' state, the service-wide counts, then the batch's dead letters, produced
       and acknowledged by the broker.  Every state write is an atomic Lua script that
       compares the partition's last applied offset, stored in Redis beside the state it
       guards, and changes the state and advances that offset in the same call (INGEST,
       LABEL, GLOBAL_COUNT; see `stratameter.state.scripts`).  If Redis fails, the whole batch
       is staged again (offsets reloaded from Redis) and retried with backoff, never
       skipped.  Only a batch applied in full has its next offset recorded for commit.
    3. `commit`: copy the offsets the states' guards acknowledged service-wide
       (``Keys.acknowledged``) and note the recorded offsets as the partitions' applied marks
       (``Keys.applied``), both through `marks` (`state.offset_store.OffsetStore`), then commit
       them to Kafka (in the background, at most every `COMMIT_INTERVAL_S`, and once more when
       the service stops).

    Why each record changes the state exactly once, without Kafka transactions: an offset
    is committed only after its batch was applied in full (2 before 3).  A crash before
    the commit redelivers the batch from the last committed offset, and applying it again
    changes nothing: each script finds the records' offsets already applied (INGEST and
    GLOBAL_COUNT compare-and-set the stored offset, and the ingestor re-aggregates only the
    records after it; LABEL answers ``replay`` for an offset at or below the stored one).
    A crash after the commit loses nothing, the state being in Redis already; a late or
    lost commit only makes that replay longer.  Two instances applying the same partition
    during a rebalance meet at the same guards.  Dead letters are produced before the
    commit, so they are at least once (a crash in between repeats them); their counts are
    exactly once.  A batch still unapplied when the service stops (Redis down) is not
    committed and is replayed by whoever consumes the partition next.

    Why the applied marks: Kafka keeps what was committed even when Redis loses writes it had
    acknowledged (`state.offsets.StateRolledBack`).  The mark of an offset is written after the
    state changes below it, so a Redis that went back went back to a mark no higher than what
    its state holds; a start replays a partition from its mark when the committed offset is
    above it (`state_watch.StateWatch.replay_rolled_back`).  A mark lower than the one this
    process noted last stops the process before the commit.
    """

    def __init__(self, batches: BatchHandler, kafka: KafkaClients, health: Health, stopping: asyncio.Event,
                 wake: asyncio.Event, marks: OffsetStore) -> None:
        self.batches, self.kafka, self.health, self.marks = batches, kafka, health, marks
        self.stopping, self.wake = stopping, wake
        self._to_commit: dict[TopicPartition, OffsetAndMetadata] = {}
        self._noted: dict[TopicPartition, int] = {}  # the applied mark this process noted last
        self._commit_due = asyncio.Event()

    # ---- 1. stage -----------------------------------------------------------------------
    async def stage(self, work, window: tuple[int, int]) -> list[StagedBatch | None]:
        """Stage a poll's (partition, records) pairs; None where Redis failed (`apply` redoes it).
        `window`: the event times accepted, read from the wall clock once per poll and kept
        when the poll is redone, so a retry judges each record as the first try did."""
        return [await self.batches.stage(tp, records, window, log_end=self._log_end(tp)) for tp, records in work]

    def _log_end(self, tp: TopicPartition) -> int | None:
        """The partition's end offset as the consumer's last fetch of it reported it (None: unknown)."""
        return self.kafka.consumer.highwater(tp)

    # ---- 2. apply -----------------------------------------------------------------------
    async def apply(self, work, staged: list[StagedBatch | None], window: tuple[int, int]) -> None:
        """Apply a staged poll, its partitions concurrently (offset guards are per partition,
        so one partition's Python work overlaps another's Redis round trip); record the
        offsets of the batches applied for `commit`."""
        done = await asyncio.gather(*(self._apply_with_retry(tp, records, s, window)
                                      for (tp, records), s in zip(work, staged)))
        # not done: stopping while Redis was down; that batch replays after a restart
        offsets = {tp: OffsetAndMetadata(records[-1].offset + 1, "") for (tp, records), ok in zip(work, done) if ok}
        if offsets:
            self._to_commit.update(offsets)
            self._commit_due.set()
            self.wake.set()

    async def _apply_with_retry(self, tp: TopicPartition, records, staged: StagedBatch | None,
                                window: tuple[int, int]) -> bool:
        """True once applied; False if the service stops while Redis is down."""
        backoff = 0.1
        while True:
            try:
                if staged is None:  # staging failed, or a retry: the whole batch again (idempotent)
                    staged = await self.batches.stage(tp, records, window, retry=True, log_end=self._log_end(tp))
                await self.batches.apply(tp, records, staged, self._log_end(tp))
                self.health.redis_ok()
                return True
            except StateRolledBack as exc:  # the next start reads the partition again from there
                await self.marks.lower_applied(applied_field(tp.topic, tp.partition), exc.stored + 1)
                raise
            except Exception as exc:
                if not redis_outage(exc):
                    raise
                staged = None  # redone with offsets reloaded from Redis (see ScoreIngestor.prepare)
                self.health.redis_failed(exc, "ingest")
                log.warning("redis failed; retrying batch: %s", describe_outage(exc))
                if await pause(self.stopping, backoff):
                    return False
                backoff = min(BACKOFF_MAX_S, backoff * 2)

    # ---- 3. commit ----------------------------------------------------------------------
    async def commit(self) -> None:
        """Commit the offsets recorded so far.  A failed commit is only logged: the state
        is in Redis already, so it means no more than a replay that changes nothing."""
        if not self._to_commit:
            return
        commits, self._to_commit = self._to_commit, {}
        try:
            await self._note_applied(commits)
        except Exception as exc:
            if not redis_outage(exc):
                raise
            self._to_commit = {**commits, **self._to_commit}  # committed with the next ones
            log.warning("could not note the applied offsets; committing later: %s", describe_outage(exc))
            return
        try:
            await self.kafka.consumer.commit(commits)
        except Exception as exc:  # noqa: BLE001 - a lost commit only means a harmless replay
            log.warning("offset commit failed; the batch will be replayed idempotently", extra={"error": repr(exc)})

    async def _note_applied(self, commits: dict[TopicPartition, OffsetAndMetadata]) -> None:
        """The states' acknowledged offsets copied service-wide (`_note_acknowledged`), then the
        applied marks raised to `commits` of the partitions this process still owns (a revoked
        one's new owner writes its own); `StateRolledBack` if one was below the mark this process
        noted last."""
        await self._note_acknowledged()
        owned = self.kafka.consumer.assignment()
        tps = [tp for tp in commits if tp in owned]
        if not tps:
            return
        before = await self.marks.note_applied(
            {applied_field(tp.topic, tp.partition): (self._noted.get(tp, -1), commits[tp].offset) for tp in tps})
        for tp, mark in zip(tps, before):
            if mark is not None and mark < self._noted.get(tp, -1):
                raise StateRolledBack(f"{tp.topic} partition {tp.partition}", mark - 1, self._noted[tp] - 1)
            self._noted[tp] = max(self._noted.get(tp, -1), commits[tp].offset)

    async def _note_acknowledged(self) -> None:
        """Copy the offsets the states' guards acknowledged since the last commit to the service-wide
        ``acknowledged`` hashes, before Kafka is told: in a Redis Cluster a state's node can go back
        while the ``{_global}`` node keeps the marks, and a start that did not write the state would
        not see it (`state_watch.StateWatch.replay_rolled_back`).  Kept for the next commit if
        Redis fails."""
        sides = (self.batches.ingestor.acknowledged, self.batches.folder.acknowledged)
        taken = [side.take() for side in sides]
        by_state: dict[str, dict[str, int]] = {}
        for side, new in zip(sides, taken):
            for sid, fields in side.fields(new).items():
                by_state.setdefault(sid, {}).update(fields)
        try:
            await self.marks.note_acknowledged(by_state)
        except BaseException:
            for side, new in zip(sides, taken):
                side.give_back(new)
            raise

    async def commit_forever(self) -> None:
        """Commit in the background, at most every `COMMIT_INTERVAL_S`, until stopping (not
        waiting for a commit keeps a Kafka round trip out of every batch)."""
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self._commit_due.wait(), COMMIT_INTERVAL_S)
            except asyncio.TimeoutError:
                continue  # nothing recorded; look at `stopping` again
            self._commit_due.clear()
            await self.commit()
            await pause(self.stopping, COMMIT_INTERVAL_S)
