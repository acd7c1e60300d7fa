"""The two-stage consume pipeline: poll, stage this poll (CPU) while the previous poll's
Redis calls are in flight, and apply this poll only once the previous one is applied
(`checkpoint.Checkpoint` holds the steps and the exactly-once argument)."""

from __future__ import annotations

import asyncio
import logging
import time

from ..config import Settings
from .checkpoint import BACKOFF_MAX_S, Checkpoint
from .consumer import KafkaClients, refresh_lag

log = logging.getLogger(__name__)

#: Event-loop turns the new apply task is given before the next poll is staged: its first turn
#: starts the partitions' tasks (`Checkpoint.apply`), the next take each to its INGEST pipeline's
#: socket write (redis-py's connection checkout, then the write).  Parsing a partition batch never
#: yields, so without these turns the Redis calls went out only when staging reached its first
#: yield (`ScoreIngestor.prepare`), after the parsing, and the loop then sat waiting for Redis
#: (measured: 2 turns still left the writes after the parsing, 3 sent them before it).  A turn
#: more than needed costs microseconds; one too few only loses the overlap.
APPLY_START_TURNS = 4
#: A poll takes as many records as the service gets through in about this long, at the rate its
#: last large poll's turn went (`PollSize`) ...
POLL_TARGET_SECONDS = 0.1
#: ... but never fewer than this (or BATCH_MAX_RECORDS, if smaller).  Below it a slow ingest (many
#: classifiers, a few records an INGEST call) would poll less and less: each call's fixed cost then
#: weighs more per record, the rate falls, and the next poll is smaller still.
MIN_POLL_RECORDS = 5000


class PollSize:
    """How many records the next poll may take: about `POLL_TARGET_SECONDS` of work at the rate of
    the last poll of at least `MIN_POLL_RECORDS` (its turn of the pipeline, `took`), between that
    floor and BATCH_MAX_RECORDS.

    Larger polls make larger INGEST calls (each classifier's share of a poll is one call), so the
    fixed costs of a call, in this process and in Redis, are paid over more records, and a call's
    reservoir candidates are its strata's bottom `RESERVOIR_SIZE` of more records (measured,
    `stratameter bench`: docs/development/benchmarks.md).  But a label answer waits for the poll being
    processed, so a fixed large poll made the label round trip slower where the ingest is slow
    (1,000 classifiers: a 20,000-record poll took over a second).  Sizing the poll by the time it
    takes keeps that wait at about `POLL_TARGET_SECONDS` wherever a poll grows past the floor.
    Only polls of at least the floor tell the rate: a small poll is mostly fixed costs, and it
    means the service has caught up with the stream, where the size does not matter."""

    def __init__(self, most: int) -> None:
        self.most = int(most)
        self.floor = min(MIN_POLL_RECORDS, self.most)
        self.records = self.floor
        self._last: tuple[int, float] | None = None  # the previous poll's records and arrival

    def arrived(self, records: int, now: float) -> None:
        """A poll of `records` arrived at `now` (`time.perf_counter`): the previous poll's turn
        ended (`took`)."""
        if self._last is not None:
            self.took(self._last[0], now - self._last[1])
        self._last = (records, now)

    def interrupted(self) -> None:
        """A poll failed: the previous poll's turn is not measured (it would count the backoff)."""
        self._last = None

    def took(self, records: int, seconds: float) -> None:
        """A poll of `records` took `seconds` of the pipeline's time: from its arrival to the next
        poll's (its staging, the wait for the previous poll's apply, whatever else the event loop
        ran meanwhile: what a label answer waits)."""
        if records >= self.floor and seconds > 0:
            self.records = max(self.floor, min(self.most, int(POLL_TARGET_SECONDS * records / seconds)))


class Pipeline:
    def __init__(self, settings: Settings, kafka: KafkaClients, checkpoint: Checkpoint, stopping: asyncio.Event,
                 lag: dict[tuple[str, int], int]) -> None:
        self.settings, self.kafka, self.checkpoint = settings, kafka, checkpoint
        self.stopping, self.lag = stopping, lag

    async def consume_forever(self) -> None:
        """Until stopping; then apply and commit the poll in hand before the consumer stops."""
        backoff = 0.1
        inflight: asyncio.Task | None = None  # the previous poll being applied
        size = PollSize(self.settings.batch_max_records)
        while not self.stopping.is_set():
            try:
                batches = await self.kafka.poll(size.records, timeout_ms=200)
            except Exception as exc:  # noqa: BLE001 - the client retries; we back off and report not ready
                log.warning("kafka poll failed", extra={"error": repr(exc)})
                size.interrupted()
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            backoff = 0.1
            work = [(tp, records) for tp, records in batches.items() if records]
            # a poll's turn: from its records' arrival to the next poll's, all of it (staging, the wait
            # for the previous poll's apply, the other tasks of the event loop), as a label waits it
            size.arrived(sum(len(records) for _, records in work), time.perf_counter())
            # The event times accepted, from the wall clock once per poll (and kept when the poll is
            # redone after a Redis failure, so a retry judges each record as the first try did).
            window = self.settings.event_time_window(int(time.time() * 1000))
            staged = await self.checkpoint.stage(work, window)
            if inflight is not None:
                await inflight
            inflight = asyncio.create_task(self.checkpoint.apply(work, staged, window))
            await start(inflight)
            await refresh_lag(self.kafka.consumer, self.lag)
        if inflight is not None:
            await inflight
        await self.checkpoint.commit()  # the batch in hand, before the consumer stops


async def start(task: asyncio.Task) -> None:
    """Give `task` `APPLY_START_TURNS` turns of the event loop (fewer if it finishes), so its
    Redis calls are on the wire while this coroutine goes on with CPU work."""
    for _ in range(APPLY_START_TURNS):
        if task.done():
            return
        await asyncio.sleep(0)
