"""The service's consumer gets aiokafka's own record objects, not `ConsumerRecord` copies
(`app.records`), against the real broker: the same offsets, timestamps, keys and values, and
every other consumer in the process still gets `ConsumerRecord`."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from stratameter.app import records
from stratameter.app.consumer import KafkaClients, Rebalance
from stratameter.config import load_settings
from stratameter.embedded import create_topics

pytestmark = pytest.mark.integration


async def _read_all(consumer, n: int) -> list:
    out: list = []
    while len(out) < n:
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            out.extend(batch)
    return out


async def test_the_service_consumer_reads_aiokafkas_own_records_and_others_are_unchanged(kafka_bootstrap,
                                                                                         unique_name):
    scores, labels = unique_name("scores"), unique_name("labels")
    await create_topics(kafka_bootstrap, [scores, labels], partitions=1)
    sent = [(b"c%d" % (i % 3) if i % 4 else None, b'{"i": %d}' % i, 1_700_000_000_000 + 7 * i) for i in range(60)]
    sent.append((b"k", None, 1_700_000_000_999))  # a tombstone: no value
    for compression, part in ((None, sent[:30]), ("gzip", sent[30:])):  # compressed batches too
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, compression_type=compression)
        await producer.start()
        try:
            await asyncio.gather(*[await producer.send(scores, value=v, key=k, timestamp_ms=ts) for k, v, ts in part])
        finally:
            await producer.stop()

    settings = load_settings({"STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "STRATAMETER_KAFKA_CONSUMER_GROUP": unique_name("group"),
                              "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
                              "STRATAMETER_TOPIC_SCORES": scores, "STRATAMETER_TOPIC_LABELS": labels})
    clients = KafkaClients(settings, Rebalance(lambda partitions: None))
    await clients.start()
    other = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await other.start()
    try:
        assert records.installed()  # with the aiokafka this project pins
        other.assign([TopicPartition(scores, 0)])
        own, wrapped = await _read_all(clients.consumer, len(sent)), await _read_all(other, len(sent))
    finally:
        await other.stop()
        await clients.stop()

    assert not any(isinstance(r, ConsumerRecord) for r in own)
    assert all(isinstance(r, ConsumerRecord) for r in wrapped)
    assert ([(r.offset, r.timestamp, r.key, r.value) for r in own]
            == [(r.offset, r.timestamp, r.key, r.value) for r in wrapped]
            == [(i, ts, k, v) for i, (k, v, ts) in enumerate(sent)])


def test_own_records_is_the_identity_where_aiokafka_calls_it_as_a_deserializer():
    assert records.own_records(b'{"x": 1}') == b'{"x": 1}'
    assert records.own_records(None) is None
