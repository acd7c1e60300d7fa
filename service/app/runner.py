"""`stratameter run`: wires the Kafka clients, the consume pipeline and its checkpoint,
the label-request loop, the leases and the readiness probes, and serves HTTP.

Where each concern lives (all under ``service/app/``): `consumer` (the Kafka clients,
lag), `pipeline` (the two-stage consume loop), `checkpoint` (stage, apply, commit: the
exactly-once argument), `batch` (what staging and applying a partition batch does),
`deadletters`, `request_task` (the request loop's driver), `ownership` (leases),
`probes` (readiness), `group` (leaving the consumer group on stop).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from aiokafka import TopicPartition

from ..config import Settings
from ..errors import StartupError
from ..ingest.ingestor import ScoreIngestor
from ..labels.folder import LabelFolder
from ..metrics.exposition import render
from ..state.process import ProcessState
from ..state.store import Store
from .batch import BatchHandler, GlobalCounts
from .checkpoint import Checkpoint
from .consumer import KafkaClients, Rebalance
from .deadletters import DeadLetters
from .failures import ClassifierFailures
from .ownership import GLOBAL_SERIES_OWNER, LEASE_MS, Leases
from .patience import until_reachable
from .pipeline import Pipeline
from .probes import Health, check_chunk_seconds, check_redis, once_redis_answers, probe_redis
from .request_task import RequestTask
from .state_watch import StateWatch

__all__ = ["GLOBAL_SERIES_OWNER", "LEASE_MS", "Service", "run", "tune_gc"]

log = logging.getLogger(__name__)


def tune_gc() -> None:
    """Batches allocate and drop hundreds of thousands of small dicts a second (decoded
    records): with the default thresholds the cyclic collector ran on about 13% of the
    ingest time.  Freeze what start-up allocated and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 50)


class Service:
    """One instance of the service.  `start()` connects, `spawn()` runs its loops as tasks
    until `stopping` is set, `stop()` hands over and closes."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.redis = settings.redis_client()
        self.store = Store(self.redis, settings.redis_key_prefix)
        # the loss epoch and the first topics: noted by the start checks and the state watch, read by
        # the batches, the request loop and the views
        self.process = ProcessState()
        self.stopping = asyncio.Event()
        self._started_checks = False  # `_start_checks` passed: the writing loops may run
        self.wake = asyncio.Event()  # state changed: the request loop looks again
        self.started_at = time.time()
        self.lag: dict[tuple[str, int], int] = {}
        self.health = Health()
        self.ingestor = ScoreIngestor(self.store, settings)
        self.counts = GlobalCounts(self.store.offsets)
        self.kafka = KafkaClients(settings, Rebalance(self._revoked, self._assigned))
        self.dead_letters = DeadLetters(self.kafka, settings.topic_dead_letter, settings.dead_letter_max_per_second)
        self.batches = BatchHandler(settings, self.ingestor, LabelFolder(self.store.requests), self.counts,
                                    self.dead_letters, self.wake, self.store.registry, self.process)
        self.checkpoint = Checkpoint(self.batches, self.kafka, self.health, self.stopping, self.wake,
                                     self.store.offsets)
        self.pipeline = Pipeline(settings, self.kafka, self.checkpoint, self.stopping, self.lag)
        self.leases = Leases(self.store.registry, settings.instance_id)
        self.failures = ClassifierFailures()  # what the request loop and the scrape confine to a classifier
        self.requests = RequestTask(self.store, self.process, settings, self.kafka, self.leases, self.health,
                                    self.stopping, self.wake, self.failures)
        self.state_watch = StateWatch(self.store, self.process, settings, self.kafka, self.batches)  # Redis losing it
        self._checking = asyncio.Lock()  # the writing loops' start checks run once (`_once_checked`)

    # what the HTTP API and the metrics read
    consumer = property(lambda self: self.kafka.consumer)
    producer = property(lambda self: self.kafka.producer)
    owned = property(lambda self: self.leases.owned)
    exports_global = property(lambda self: self.leases.exports_global)
    dead_letters_dropped = property(lambda self: self.dead_letters.dropped)

    def ready(self) -> bool:
        return self.health.ready()

    async def render_metrics(self) -> bytes:
        """The /metrics body (`metrics.exposition`)."""
        return await render(self)

    def _revoked(self, partitions: list[TopicPartition]) -> None:
        """Partitions taken away: forget the offsets cached for them (another instance moves them now)."""
        for tp in partitions:
            if tp.topic == self.settings.topic_scores:
                self.ingestor.forget_partition(self.batches.offset_field(tp))
            else:
                self.batches.folder.forget_partition(self.batches.offset_field(tp))
        self.counts.forget()

    async def _assigned(self, partitions: list[TopicPartition]) -> None:
        """Partitions given: read again those Redis went back on (`StateWatch.replay_rolled_back`)."""
        await self.state_watch.replay_rolled_back(partitions)

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        """Connect to Redis and Kafka.  Raises `StartupError` (a message without secrets) when Redis
        rejects the credentials or holds state of another chunk length, or Kafka does not answer
        within ``STRATAMETER_STARTUP_TIMEOUT_SECONDS`` (`patience`: retried with backoff meanwhile);
        Redis being merely down is waited for by the loops that need it (`_once_checked`, the same
        rule).  Then `_start_checks`, if Redis answered; nothing more if `stopping` was set first."""
        tune_gc()
        answered = await check_redis(self.redis, self.settings)
        started = await until_reachable(self._start_kafka, "Kafka", self.settings.startup_timeout_seconds,
                                        self.stopping)
        if started and answered:
            await self._start_checks()

    async def _start_kafka(self) -> bool:
        await self.kafka.start()
        return True

    def spawn(self, requests: bool = True) -> list[asyncio.Task]:
        """Start the service's loops as tasks (after `start()`); they end when `stopping` is set.
        The first is the consume pipeline.

        `requests=False` leaves out the label-request loop (ingest only, as the benchmark runs)."""
        loops = [self._once_checked(self.pipeline.consume_forever), self.checkpoint.commit_forever(),
                 self.health.probe_forever(self._probe_kafka, self._probe_redis, self.stopping)]
        if requests:
            loops.append(self._once_checked(self.requests.requests_forever))
        return [asyncio.create_task(c) for c in loops]

    async def _once_checked(self, loop) -> None:
        """`loop()` once `_start_checks` passed (at start if Redis answered, else as soon as it does),
        so nothing is written under another chunk length or before a loss is noted; another chunk
        length ends this task, and the process with exit code 1."""
        try:
            checked = await self._start_checks()
        except StartupError as exc:
            log.error("cannot go on: %s", exc)
            raise
        if checked:
            await loop()

    async def _start_checks(self) -> bool:
        """Once, before anything is written: the chunk length the state was written with
        (`check_chunk_seconds`), which topics its offsets count (`BatchHandler.offset_field`), then
        whether Redis lost the state while the service was away (`state_watch`).  False if the
        service stops first."""
        async with self._checking:
            if not self._started_checks:
                if await once_redis_answers(self._note_settings, self.settings, self.stopping) is None:  # stopping
                    return False
                await self.state_watch.check_at_start()
                self._started_checks = True
            return True

    async def _note_settings(self) -> tuple[str, str]:
        """The chunk length the state was written with (checked), and its first topics (kept)."""
        registry = self.store.registry
        await check_chunk_seconds(registry, self.settings)
        self.process.first_topics = await registry.noted_topics(self.settings.topic_scores, self.settings.topic_labels)
        return self.process.first_topics

    async def _probe_kafka(self) -> None:
        await self.kafka.producer.client.fetch_all_metadata()

    async def _probe_redis(self) -> None:
        await probe_redis(self.redis, self.store.keys, self.settings.instance_id)
        if self._started_checks:
            await self.state_watch.check()

    async def stop(self) -> None:
        """Release the leases (immediate takeover), leave the consumer group, close."""
        try:
            await asyncio.wait_for(self.leases.release_all(), 2)
        except Exception as exc:  # noqa: BLE001 - leases expire by themselves anyway
            log.warning("could not release leases: %r", exc)
        await self.kafka.stop()
        await self.redis.aclose()


async def run(settings: Settings) -> int:
    """Run until SIGTERM/SIGINT: finish the batch in hand, commit, close."""
    from ..api.http import serve
    from .lifecycle import run_until_stopped

    return await run_until_stopped(Service(settings), settings, serve, "STRATAMETER_HTTP", settings.http_host,
                                   settings.http_port, lambda: ("stratameter started", {}))
