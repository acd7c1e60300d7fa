"""`stratameter run`: wires Kafka, Redis, the ingest/labels/requests adapters and HTTP.

Checkpoint discipline (quix-streams' "state and offsets together", without
Kafka transactions): a partition batch is applied to Redis by idempotent,
offset-guarded scripts, dead letters are produced and acknowledged, and only
then is the batch's Kafka offset committed.  A crash anywhere replays the
batch, and the offset guards in Redis turn the replay into a no-op.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import time
from collections import defaultdict
from urllib.parse import urlsplit

import numpy as np
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata
from redis.asyncio import Redis
from redis.exceptions import AuthenticationError, RedisError

from schemas.parse import dead_letter_record, parse_labels, parse_scores
from ..config import mask_url
from ..ingest.ingestor import ScoreIngestor
from ..labels.folder import LabelFolder
from .ownership import preferred_owner
from ..requests.loop import RequestLoop
from ..state.store import Store

log = logging.getLogger("stratameter")

BACKOFF_MAX_S = 5.0
PROBE_INTERVAL_S = 2.0
COMMIT_INTERVAL_S = 0.2
#: Larger fetches keep aiokafka's prefetch buffer ahead of the CPU-bound batch processing (the
#: fetcher runs on the same event loop, so it cannot refill the buffer while a batch is processed).
FETCH_BYTES_PER_PARTITION = 8 << 20
#: An empty labels partition must not hold a fetch that also carries scores.
FETCH_MAX_WAIT_MS = 100
READY_WINDOW_S = 3 * PROBE_INTERVAL_S
LEASE_MS = 10_000
#: Service-wide series (invalid records, unroutable labels) are exported by one replica only, the
#: rendezvous owner of this pseudo-classifier, so summing over replicas never double-counts them.
GLOBAL_SERIES_OWNER = ""


class StartupError(RuntimeError):
    """The service cannot start (wrong credentials, unreachable Kafka); the message holds no secret."""


def describe(exc: BaseException) -> str:
    """``Type: message`` (redis-py's repr, e.g. ``auth:AuthenticationError``, omits the message)."""
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _Rebalance(ConsumerRebalanceListener):
    def __init__(self, service: "Service") -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked):
        for tp in revoked:
            if tp.topic == self.service.settings.topic_scores:
                self.service.ingestor.forget_partition(tp.partition)
        self.service.global_offsets.clear()

    async def on_partitions_assigned(self, assigned):
        log.info("partitions assigned", extra={"partitions": sorted(f"{t.topic}:{t.partition}" for t in assigned)})


def tune_gc() -> None:
    """Batches allocate and drop hundreds of thousands of small dicts a second (decoded
    records): with the default thresholds the cyclic collector ran on about 13% of the
    ingest time.  Freeze what start-up allocated and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(100_000, 50, 50)


class DeadLetterLimiter:
    """Token bucket: the dead-letter producer can never amplify bad traffic."""

    def __init__(self, per_second: float) -> None:
        self.rate = float(per_second)
        self.tokens = self.rate
        self.at = time.monotonic()

    def allow(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


class Service:
    def __init__(self, settings) -> None:
        self.settings = settings
        self.redis = Redis.from_url(settings.redis_url_with_credentials(), socket_timeout=5, socket_connect_timeout=5,
                                    health_check_interval=10, **settings.redis_client_kwargs())
        self.store = Store(self.redis, settings.redis_key_prefix)
        self.ingestor = ScoreIngestor(self.store, settings)
        self.folder = LabelFolder(self.store)
        self.loop = RequestLoop(self.store, settings, self._publish_requests)
        self.global_offsets: dict[tuple[str, int], int] = {}
        self.dead_letters = DeadLetterLimiter(settings.dead_letter_max_per_second)
        self.dead_letters_dropped = 0
        self.owned: set[str] = set()
        self.stopping = asyncio.Event()
        self.wake = asyncio.Event()
        self.kafka_ok_at = 0.0
        self.redis_ok_at = 0.0
        self.started_at = time.time()
        self.consumer: AIOKafkaConsumer | None = None
        self.producer: AIOKafkaProducer | None = None
        self.lag: dict[tuple[str, int], int] = {}
        self._republished: set[str] = set()
        self._free_since: dict[str, float] = {}
        self.exports_global = True  # until the first heartbeat says otherwise
        self._to_commit: dict = {}
        self._commit_due = asyncio.Event()

    # ---- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        tune_gc()
        """Connect to Redis and Kafka.  Raises `StartupError` (a message without secrets) when Redis
        rejects the credentials or Kafka cannot be bootstrapped; Redis being merely down is reported
        by readiness instead."""
        await self._check_redis()
        kafka = self.settings.kafka_client_kwargs()
        try:
            self.producer = AIOKafkaProducer(acks="all", linger_ms=5, enable_idempotence=False, **kafka)
            await self.producer.start()
            self.consumer = AIOKafkaConsumer(
                group_id=self.settings.kafka_consumer_group, enable_auto_commit=False, auto_offset_reset="earliest",
                session_timeout_ms=self.settings.kafka_session_timeout_ms, heartbeat_interval_ms=500,
                max_poll_records=self.settings.batch_max_records, max_partition_fetch_bytes=FETCH_BYTES_PER_PARTITION,
                fetch_max_wait_ms=FETCH_MAX_WAIT_MS, **kafka)
            self.consumer.subscribe([self.settings.topic_scores, self.settings.topic_labels], listener=_Rebalance(self))
            await self.consumer.start()
        except KafkaError as exc:
            s = self.settings
            how = s.kafka_security_protocol + (f" with SASL {s.kafka_sasl_mechanism} as user {s.kafka_sasl_username!r}"
                                               if s.kafka_security_protocol.startswith("SASL_") else "")
            raise StartupError(f"cannot connect to Kafka at {s.kafka_bootstrap_servers} ({how}): {describe(exc)}; "
                               "the aiokafka log line above has the broker's answer") from None

    async def _check_redis(self) -> None:
        try:
            await asyncio.wait_for(self.redis.ping(), PROBE_INTERVAL_S)
        except AuthenticationError as exc:
            user = self.settings.redis_username or urlsplit(self.settings.redis_url).username or "default"
            raise StartupError(f"Redis at {mask_url(self.settings.redis_url)} rejected the credentials of user "
                               f"{user!r}: {describe(exc)} (check STRATAMETER_REDIS_USERNAME / "
                               "STRATAMETER_REDIS_PASSWORD)") from None
        except Exception as exc:  # noqa: BLE001 - down or unreachable: readiness reports it, we keep trying
            log.warning("redis not reachable at start: %s", describe(exc))

    def spawn(self, requests: bool = True) -> list[asyncio.Task]:
        """Start the service's loops as tasks (after `start()`); they end when `stopping` is set.

        `requests=False` leaves out the label-request loop (ingest only, as the benchmark runs)."""
        loops = [self.consume_forever(), self.commit_forever(), self.probe_forever()]
        if requests:
            loops.append(self.requests_forever())
        return [asyncio.create_task(c) for c in loops]

    async def stop(self) -> None:
        try:
            await asyncio.wait_for(self.release_all(), 2)
        except Exception as exc:  # noqa: BLE001 - leases expire by themselves anyway
            log.warning("could not release leases: %r", exc)
        if self.consumer is not None:
            try:
                from ..embedded import leave_group_on_stop

                leave_group_on_stop(self.consumer)
            except Exception:  # pragma: no cover - best effort
                pass
            await self.consumer.stop()
        if self.producer is not None:
            await self.producer.stop()
        await self.redis.aclose()

    def ready(self) -> bool:
        """Kafka and Redis both answered a probe within the last `READY_WINDOW_S`."""
        now = time.time()
        return now - self.kafka_ok_at < READY_WINDOW_S and now - self.redis_ok_at < READY_WINDOW_S

    async def probe_forever(self) -> None:
        """Probe Kafka (a metadata request) and Redis (PING) every `PROBE_INTERVAL_S`.

        aiokafka never raises while a broker is unreachable (it waits and
        retries), so readiness cannot be inferred from polling: it is probed.
        """
        while not self.stopping.is_set():
            for probe, mark in ((self._probe_kafka, "kafka_ok_at"), (self.redis.ping, "redis_ok_at")):
                try:
                    await asyncio.wait_for(probe(), PROBE_INTERVAL_S)
                    setattr(self, mark, time.time())
                except Exception as exc:  # noqa: BLE001 - any failure means not ready
                    log.warning("%s probe failed: %s", mark.split("_")[0], describe(exc))
            try:
                await asyncio.wait_for(self.stopping.wait(), PROBE_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    async def _probe_kafka(self) -> None:
        await self.producer.client.fetch_all_metadata()

    # ---- consume ------------------------------------------------------------------------
    async def consume_forever(self) -> None:
        backoff = 0.1
        inflight: asyncio.Task | None = None  # the previous poll being applied
        while not self.stopping.is_set():
            try:
                batches = await self.consumer.getmany(timeout_ms=200, max_records=self.settings.batch_max_records)
            except Exception as exc:  # noqa: BLE001 - the client retries; we back off and report not ready
                log.warning("kafka poll failed", extra={"error": repr(exc)})
                await asyncio.sleep(backoff)
                backoff = min(BACKOFF_MAX_S, backoff * 2)
                continue
            backoff = 0.1
            work = [(tp, records) for tp, records in batches.items() if records]
            # The event times accepted, from the wall clock once per poll (and kept when the poll is
            # redone after a Redis failure, so a retry judges each record as the first try did).
            window = self.settings.event_time_window(int(time.time() * 1000))
            # Two-stage pipeline: parse and aggregate this poll (CPU) while the previous poll's
            # Redis calls are in flight; apply this poll only once the previous one is applied.
            staged = [await self._stage(tp, records, window) for tp, records in work]
            if inflight is not None:
                self._queue_commits(await inflight)
            inflight = asyncio.create_task(self._finish_all(work, staged, window))
            await self._refresh_lag()
        if inflight is not None:
            self._queue_commits(await inflight)
        await self._commit_pending()  # the batch in hand, before the consumer stops

    async def commit_forever(self) -> None:
        """Commit consumed offsets in the background, at most every `COMMIT_INTERVAL_S`.

        The state is already in Redis (offset-guarded) when an offset is queued here,
        so a commit that is late or lost only means a replay that changes nothing;
        not waiting for it keeps a Kafka round trip out of every batch."""
        while not self.stopping.is_set():
            try:
                await asyncio.wait_for(self._commit_due.wait(), COMMIT_INTERVAL_S)
            except asyncio.TimeoutError:
                continue  # nothing queued; look at `stopping` again
            self._commit_due.clear()
            await self._commit_pending()
            try:
                await asyncio.wait_for(self.stopping.wait(), COMMIT_INTERVAL_S)
            except asyncio.TimeoutError:
                pass

    async def _commit_pending(self) -> None:
        if self._to_commit:
            commits, self._to_commit = self._to_commit, {}
            await self._commit(commits)

    async def _commit(self, commits) -> None:
        try:
            await self.consumer.commit(commits)
        except Exception as exc:  # noqa: BLE001 - a lost commit only means a harmless replay
            log.warning("offset commit failed; the batch will be replayed idempotently", extra={"error": repr(exc)})

    async def _refresh_lag(self) -> None:
        try:
            for tp in self.consumer.assignment():
                hw = self.consumer.highwater(tp)
                pos = await self.consumer.position(tp) if hw is not None else None
                if hw is not None and pos is not None:
                    self.lag[(tp.topic, tp.partition)] = max(0, hw - pos)
        except Exception:  # noqa: BLE001 - lag is informative only
            pass

    def _queue_commits(self, commits: dict) -> None:
        if commits:
            self._to_commit.update(commits)
            self._commit_due.set()
            self.wake.set()

    async def _finish_all(self, work, staged, window: tuple[int, int]) -> dict:
        """Apply one poll's partitions concurrently (offset guards are per partition, so one
        partition's Python work overlaps another's Redis round trip); the offsets to commit."""
        done = await asyncio.gather(*(self._finish_with_retry(tp, records, s, window)
                                      for (tp, records), s in zip(work, staged)))
        # not done: stopping while Redis was down; that batch replays after a restart
        return {tp: OffsetAndMetadata(records[-1].offset + 1, "") for (tp, records), ok in zip(work, done) if ok}

    async def _finish_with_retry(self, tp: TopicPartition, records, staged, window: tuple[int, int]) -> bool:
        backoff = 0.1
        while True:
            try:
                if staged is not None:
                    await self._finish(tp, records, staged)
                else:  # staging failed, or a retry: the whole batch again (idempotent)
                    await self._finish(tp, records, await self._stage(tp, records, window, retry=True))
                self.redis_ok_at = time.time()
                return True
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                staged = None  # redone with offsets reloaded from Redis (see ScoreIngestor.prepare)
                self.redis_ok_at = 0.0
                log.warning("redis unavailable; retrying batch: %r", exc)
                try:
                    await asyncio.wait_for(self.stopping.wait(), backoff)
                    return False
                except asyncio.TimeoutError:
                    backoff = min(BACKOFF_MAX_S, backoff * 2)

    async def _stage(self, tp: TopicPartition, records, window: tuple[int, int], retry: bool = False):
        """Parse a partition batch; for scores also aggregate it into INGEST calls.
        `window`: the event times accepted (`Settings.event_time_window`); a score outside it is
        dead-lettered (``event_time_in_future`` / ``event_time_too_late``) and creates no chunk.
        None if Redis failed meanwhile (the batch is then redone by `_finish_with_retry`)."""
        values = [r.value for r in records]
        stamps = [r.timestamp for r in records]
        offsets = np.fromiter((r.offset for r in records), dtype=np.int64, count=len(records))
        if tp.topic != self.settings.topic_scores:
            batch, rejects = parse_labels(values, stamps)
            return offsets, batch, list(rejects), None
        batch, rejects = parse_scores(values, stamps, self.settings.threshold_for, window=window)
        prepared = None
        if batch.index.size:
            try:
                prepared = await self.ingestor.prepare(tp.partition, offsets[batch.index], batch.classifier_id,
                                                       batch.item_id, batch.score, batch.predicted_positive,
                                                       batch.event_time_ms, batch.context, reload_offsets=retry)
            except (RedisError, OSError, asyncio.TimeoutError):
                if retry:
                    raise
                return None
        return offsets, batch, list(rejects), prepared

    async def _finish(self, tp: TopicPartition, records, staged) -> None:
        """Apply a staged partition batch: state, service-wide counts, dead letters."""
        offsets, batch, rejects, prepared = staged
        if prepared is not None:
            await self.ingestor.submit(prepared)
        elif tp.topic != self.settings.topic_scores and batch.index.size:
            outcomes = await self.folder.apply(tp.partition, offsets[batch.index], batch.request_id, batch.label,
                                               batch.labeler_id)
            unknown_global = []
            for o in outcomes:
                pos = int(batch.index[o.index])
                if o.outcome in ("unknown", "duplicate", "expired"):
                    rejects.append((pos, "unknown_request" if o.outcome == "unknown" else o.outcome,
                                    f"label for request_id {batch.request_id[o.index]!r}: {o.outcome}"))
                if o.classifier_id == "":  # names no classifier: counted service-wide
                    unknown_global.append(pos)
                if o.outcome in ("accepted", "skipped"):
                    self.wake.set()
            await self._count_global(tp, "labels-unknown", self.store.keys.global_stem + ":labels_unknown",
                                     {int(offsets[p]): "unknown" for p in unknown_global}, offsets)
        invalid = {int(offsets[i]): reason for i, reason, _ in rejects
                   if reason not in ("unknown_request", "duplicate", "expired")}
        await self._count_global(tp, tp.topic, self.store.keys.invalid, invalid, offsets, prefix=f"{tp.topic}|")
        await self._dead_letter(tp, records, rejects)

    async def _count_global(self, tp, scope: str, counts_key: str, by_offset: dict[int, str], offsets,
                            prefix: str = "") -> None:
        """Add counts keyed by reason, guarded by the partition offset of `scope`.

        A batch with nothing to count skips the call: the guard compares offsets
        (`off > stored`), so it need not advance over records it never counts."""
        if not by_offset:
            return
        okey = self.store.keys.global_offsets(scope)
        key = (scope, tp.partition)
        if key not in self.global_offsets:
            v = await self.redis.hget(okey, str(tp.partition))
            self.global_offsets[key] = int(v) if v is not None else -1
        last = int(offsets[-1])
        while self.global_offsets[key] < last:
            base = self.global_offsets[key]
            counts: dict[str, int] = defaultdict(int)
            for off, reason in by_offset.items():
                if off > base:
                    counts[prefix + reason] += 1
            args: list = [tp.partition, base, last]
            for field, c in counts.items():
                args += [field, c]
            res = await self.store._scripts["GLOBAL_COUNT"](keys=[okey, counts_key], args=args)
            self.global_offsets[key] = int(res[1])

    async def _dead_letter(self, tp, records, rejects) -> None:
        if not rejects:
            return
        futures = []
        for i, reason, detail in rejects:
            if not self.dead_letters.allow():
                self.dead_letters_dropped += 1
                continue
            r = records[i]
            value = dead_letter_record(r.value, r.key, tp.topic, tp.partition, r.offset, reason, detail, time.time())
            futures.append(await self.producer.send(self.settings.topic_dead_letter, value=value, key=r.key))
        if futures:
            await asyncio.gather(*futures)

    # ---- label requests -----------------------------------------------------------------
    async def _publish_requests(self, records: list[tuple[str, bytes]]) -> None:
        futures = [await self.producer.send(self.settings.topic_label_requests, value=v, key=k.encode())
                   for k, v in records]
        if futures:
            await asyncio.gather(*futures)

    async def requests_forever(self) -> None:
        next_lease = 0.0
        while not self.stopping.is_set():
            try:
                now = time.monotonic()
                if now >= next_lease:
                    await self._renew_leases()
                    next_lease = now + LEASE_MS / 3000
                for cid in sorted(self.owned):
                    if cid not in self._republished:
                        await self.loop.republish_outbox(cid)
                        self._republished.add(cid)
                    await self.loop.step(cid)
                self.redis_ok_at = time.time()
            except (RedisError, OSError, asyncio.TimeoutError) as exc:
                self.redis_ok_at = 0.0
                log.warning("request loop: redis unavailable", extra={"error": repr(exc)})
            except Exception:  # noqa: BLE001 - never let the loop die; report and go on
                log.exception("request loop step failed")
            try:
                await asyncio.wait_for(self.wake.wait(), 0.25)
            except asyncio.TimeoutError:
                pass
            self.wake.clear()

    async def _renew_leases(self) -> None:
        """Take or keep the leases this instance should hold, hand over the others."""
        me = self.settings.instance_id
        live = await self.store.heartbeat(me, int(time.time() * 1000), LEASE_MS)
        self.exports_global = preferred_owner(GLOBAL_SERIES_OWNER, live) == me
        cids = await self.store.classifiers()
        holders = await self.store.lease_holders(cids)
        owned = set()
        for cid in cids:
            holder = holders[cid]
            preferred = preferred_owner(cid, live) == me
            if holder is None:
                seen_free = self._free_since.setdefault(cid, time.monotonic())
                waited = time.monotonic() - seen_free >= LEASE_MS / 3000
                if (preferred or waited) and await self.store.acquire_lease(cid, me, LEASE_MS):
                    owned.add(cid)
                continue
            self._free_since.pop(cid, None)
            if holder != me:
                continue
            if not preferred and preferred_owner(cid, live) is not None:
                await self.store.release_lease(cid, me)  # hand over to the preferred live instance
            elif await self.store.acquire_lease(cid, me, LEASE_MS):
                owned.add(cid)
        for cid in self.owned - owned:
            self._republished.discard(cid)
        self.owned = owned

    async def release_all(self) -> None:
        """On shutdown: give every lease back so another instance takes over at once."""
        for cid in list(self.owned):
            await self.store.release_lease(cid, self.settings.instance_id)
        self.owned = set()
        await self.store.leave(self.settings.instance_id)


async def run(settings) -> int:
    """Run until SIGTERM/SIGINT: finish the batch in hand, commit, close."""
    from ..api.http import serve
    from .logs import redact

    redact(settings.secret_values())
    service = Service(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, service.stopping.set)
    server = await serve(service, settings.http_host, settings.http_port)
    try:
        await service.start()
    except StartupError as exc:
        log.error("cannot start: %s", exc)
        server.close()
        await service.stop()
        return 1
    log.info("stratameter started", extra={"settings": settings.safe_dict()})
    tasks = service.spawn()
    await service.stopping.wait()
    log.info("stopping")
    await asyncio.gather(*tasks, return_exceptions=True)
    server.close()
    await service.stop()
    log.info("stopped")
    return 0
