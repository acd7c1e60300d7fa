"""The Kafka clients of `stratameter run`: one consumer of the scores and labels topics
(manual commits, see `checkpoint`), one producer (dead letters, label requests), and
the consumer lag the metrics report."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError

from ..config import Settings
from ..errors import kafka_startup_reason
from .group import leave_group_on_stop
from .patience import Unreachable
from .records import install as install_own_records, own_records

log = logging.getLogger(__name__)

#: Larger fetches keep aiokafka's prefetch buffer ahead of the CPU-bound batch processing (the
#: fetcher runs on the same event loop, so it cannot refill the buffer while a batch is processed).
FETCH_BYTES_PER_PARTITION = 8 << 20
#: An empty labels partition must not hold a fetch that also carries scores.
FETCH_MAX_WAIT_MS = 100


class Rebalance(ConsumerRebalanceListener):
    """Calls `on_revoked(partitions)` when the group takes partitions away (caches of
    offsets read for them must be dropped: another instance may move them now), and awaits
    `on_assigned(partitions)` when it gives some (before they are fetched: it may seek)."""

    def __init__(self, on_revoked: Callable[[list[TopicPartition]], None],
                 on_assigned: Callable[[list[TopicPartition]], Awaitable] | None = None) -> None:
        self.on_revoked, self.on_assigned = on_revoked, on_assigned

    async def on_partitions_revoked(self, revoked):
        self.on_revoked(list(revoked))

    async def on_partitions_assigned(self, assigned):
        log.info("partitions assigned", extra={"partitions": sorted(f"{t.topic}:{t.partition}" for t in assigned)})
        if self.on_assigned is not None:
            await self.on_assigned(list(assigned))


class KafkaClients:
    """The producer and the consumer (subscribed to the scores and labels topics)."""

    def __init__(self, settings: Settings, listener: Rebalance) -> None:
        self.settings, self.listener = settings, listener
        self.producer: AIOKafkaProducer | None = None
        self.consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Start both clients.  Raises `patience.Unreachable` when Kafka cannot be bootstrapped,
        having closed whatever was created (so it can be called again)."""
        s = self.settings
        kafka = s.kafka_client_kwargs()
        try:
            self.producer = AIOKafkaProducer(acks="all", linger_ms=5, enable_idempotence=False, **kafka)
            await self.producer.start()
            install_own_records()  # the records come as aiokafka's own objects, unwrapped (`records`)
            self.consumer = AIOKafkaConsumer(
                group_id=s.kafka_consumer_group, enable_auto_commit=False, auto_offset_reset="earliest",
                value_deserializer=own_records,
                session_timeout_ms=s.kafka_session_timeout_ms, heartbeat_interval_ms=500,
                max_poll_records=s.batch_max_records, max_partition_fetch_bytes=FETCH_BYTES_PER_PARTITION,
                fetch_max_wait_ms=FETCH_MAX_WAIT_MS, **kafka)
            self.consumer.subscribe([s.topic_scores, s.topic_labels], listener=self.listener)
            await self.consumer.start()
        except KafkaError as exc:
            await self.stop()
            self.consumer = self.producer = None
            raise Unreachable(kafka_startup_reason(s, exc)) from None

    async def poll(self, max_records: int, timeout_ms: int) -> dict:
        """One poll of at most `max_records`, the labels partitions first.

        aiokafka's `getmany` drains the partitions in the order their fetched data arrived,
        and the fetcher buffers up to `FETCH_BYTES_PER_PARTITION` of each scores partition
        ahead: a label answer behind those buffers waited until the service had processed
        them (measured by ``stratameter bench --serve``: label round trip p50 1.1 s with scores
        streaming at half the ingest rate).  Taking the labels partitions' records first puts a
        label in the next staged poll.  Waits up to `timeout_ms` only when nothing at all is
        buffered (then the first record of any partition ends the wait)."""
        consumer = self.consumer
        assigned = consumer.assignment()
        labels = [tp for tp in assigned if tp.topic == self.settings.topic_labels]
        others = [tp for tp in assigned if tp.topic != self.settings.topic_labels]
        out = await consumer.getmany(*labels, timeout_ms=0, max_records=max_records) if labels else {}
        taken = sum(len(records) for records in out.values())
        if taken < max_records and (others or not taken):
            more = await (consumer.getmany(*others, timeout_ms=0, max_records=max_records - taken) if taken else
                          consumer.getmany(timeout_ms=timeout_ms, max_records=max_records))
            for tp, records in more.items():
                out.setdefault(tp, []).extend(records)
        return out

    async def stop(self) -> None:
        await stop_clients(self.consumer, self.producer)


async def stop_clients(consumer: AIOKafkaConsumer | None, producer: AIOKafkaProducer | None) -> None:
    """Leave the consumer's group at once (the SIGTERM handover, see `group`), then close both
    (either may be None: not started)."""
    if consumer is not None:
        try:
            leave_group_on_stop(consumer)
        except Exception:  # pragma: no cover - best effort
            pass
        await consumer.stop()
    if producer is not None:
        await producer.stop()


async def refresh_lag(consumer: AIOKafkaConsumer, lag: dict[tuple[str, int], int]) -> None:
    """Records behind the partition end, per assigned (topic, partition), into `lag`."""
    try:
        for tp in consumer.assignment():
            hw = consumer.highwater(tp)
            pos = await consumer.position(tp) if hw is not None else None
            if hw is not None and pos is not None:
                lag[(tp.topic, tp.partition)] = max(0, hw - pos)
    except Exception:  # noqa: BLE001 - lag is informative only
        pass
