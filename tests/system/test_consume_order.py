"""The consume loop's poll takes label answers ahead of buffered score records
(`app.consumer.KafkaClients.poll`), against the real broker.  aiokafka's own `getmany`
drains the partitions in the order their fetched data arrived, so an answer fetched
after a large scores fetch waited until every buffered score had been processed."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaProducer

from stratameter.app.consumer import KafkaClients, Rebalance
from stratameter.config import load_settings
from stratameter.embedded import create_topics

pytestmark = pytest.mark.integration

BUFFERED_SCORES = 30_000


async def _clients(kafka_bootstrap: str, unique_name) -> tuple[KafkaClients, str, str]:
    scores, labels = unique_name("scores"), unique_name("labels")
    await create_topics(kafka_bootstrap, [scores, labels], partitions=1)
    settings = load_settings({"STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
                              "STRATAMETER_KAFKA_CONSUMER_GROUP": unique_name("group"),
                              "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
                              "STRATAMETER_TOPIC_SCORES": scores, "STRATAMETER_TOPIC_LABELS": labels})
    return KafkaClients(settings, Rebalance(lambda partitions: None)), scores, labels


async def _produce(kafka_bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=20)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, v) for v in values])
    finally:
        await producer.stop()


async def test_a_label_answer_overtakes_buffered_scores(kafka_bootstrap, unique_name):
    clients, scores, labels = await _clients(kafka_bootstrap, unique_name)
    await _produce(kafka_bootstrap, scores, [b'{"s": %d}' % i for i in range(BUFFERED_SCORES)])
    await clients.start()
    try:
        seen_scores = 0
        while not seen_scores:  # joins the group; the fetcher then buffers the scores partition
            seen_scores += sum(len(r) for r in (await clients.poll(10, timeout_ms=500)).values())
        await _produce(kafka_bootstrap, labels, [b'{"label": 1}'])
        label_after = None
        while label_after is None and seen_scores < BUFFERED_SCORES:
            batches = await clients.poll(10, timeout_ms=200)
            for tp, records in batches.items():
                if tp.topic == labels:
                    assert [r.value for r in records] == [b'{"label": 1}']
                    label_after = seen_scores
                else:
                    seen_scores += len(records)
            await asyncio.sleep(0.001)  # a staged poll takes time; the fetcher runs meanwhile
        # taken as soon as fetched, not behind the ~30,000 scores buffered before it
        assert label_after is not None and label_after < BUFFERED_SCORES // 3, (label_after, seen_scores)
        # the labels come first also inside one poll, which then fills up with scores
        await _produce(kafka_bootstrap, labels, [b'{"label": 2}', b'{"label": 3}'])
        for _ in range(100):
            batches = await clients.poll(10, timeout_ms=200)
            if any(tp.topic == labels for tp in batches):
                break
            seen_scores += sum(len(r) for r in batches.values())
            await asyncio.sleep(0.01)
        topics = [tp.topic for tp in batches]
        assert topics[0] == labels and sum(len(r) for r in batches.values()) == 10, topics
    finally:
        await clients.stop()


async def test_an_idle_poll_waits_for_the_first_record_of_any_topic(kafka_bootstrap, unique_name):
    clients, scores, labels = await _clients(kafka_bootstrap, unique_name)
    await clients.start()
    try:
        for _ in range(50):  # the group join
            await clients.poll(10, timeout_ms=100)
            if clients.consumer.assignment():
                break
        assert await clients.poll(10, timeout_ms=100) == {}
        producing = asyncio.create_task(_produce(kafka_bootstrap, labels, [b'{"label": 1}']))
        batches = await clients.poll(10, timeout_ms=5000)
        while not batches:
            batches = await clients.poll(10, timeout_ms=5000)
        await producing
        assert [(tp.topic, [r.value for r in rs]) for tp, rs in batches.items()] == [(labels, [b'{"label": 1}'])]
    finally:
        await clients.stop()
