"""A topic changed under a deployment: the scores or labels topic renamed, or moved to another
Kafka cluster under another name.  Offsets count the records of one topic, and the state keeps,
per classifier and partition, the last offset it applied (the exactly-once guards of INGEST and
LABEL); a new topic numbers its records from 0 again.  Before, its records at or below the old
topic's offsets read as replays and were dropped without a word (measured with this test: the
second scores topic's 200 scores counted 0; of 300 answers on the second labels topic the first
10, as many as the first one had carried, got no outcome at all).  Now the offsets of any topic
but the ones the state was first written from are kept under ``<topic>:<partition>``
(`app.batch.BatchHandler.offset_field`).  Against the real broker and Redis.
"""

from __future__ import annotations

import orjson
from aiokafka import AIOKafkaProducer

from stratameter.config import load_settings
from stratameter.embedded import create_topics, find_free_port
from stratameter.stats import streams
from tests.harness import Reviewer, service_topics, serving, wait_for


async def _run(kafka_bootstrap, redis_url, topics, prefix, group, reviewer_group, first, n, outcomes_before):
    """Serve on `topics`, send `n` scores and answer every label request until each answer has an
    outcome (or 30 s pass beyond the silence that ends the arrivals); returns the classifier's scores,
    its label outcomes (every one: an answer is accepted, a duplicate or expired) and the answers sent."""
    from stratameter.app.runner import Service

    port = find_free_port()
    env = {"KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA_CONSUMER_GROUP": group,
           "KAFKA_SESSION_TIMEOUT_MS": "6000", "REDIS_URL": redis_url, "REDIS_KEY_PREFIX": prefix,
           "TOPIC_SCORES": topics["scores"], "TOPIC_LABEL_REQUESTS": topics["requests"],
           "TOPIC_LABELS": topics["labels"], "TOPIC_DEAD_LETTER": topics["dlq"], "HTTP_PORT": str(port),
           "DELTA": "0.05", "MAX_LABELS_PER_HOUR": "20000"}
    service = Service(load_settings({f"STRATAMETER_{k}": v for k, v in env.items()}))
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    async with serving(service, port, topics, producer, kafka_bootstrap) as running:
        for i in range(first, first + n):
            await running.send_score(classifier_id="c", item_id=f"i{i}", score=0.5 + 0.5 * (i % 10) / 10)
        await producer.flush()

        async def figures():
            status, body = await running.get("/v1/classifiers/c")
            doc = orjson.loads(body) if status == 200 else {"scores": 0, "labels_by_outcome": {}}
            return doc["scores"], sum(doc["labels_by_outcome"].values())

        async with Reviewer(running, reviewer_group, lambda req: int(req["item_id"][1:]) % 3 != 0) as reviewer:
            async def settled():
                scores, outcomes = await figures()
                return scores >= first + n and len(reviewer.requests) >= 10 and \
                    outcomes == outcomes_before + len(reviewer.requests)

            try:  # the round after the warm-up waits for the arrivals' silence (`streams.min_silence`)
                await wait_for(settled, 30 + streams.min_silence(3600),
                               "the scores counted and every answer given an outcome")
            except AssertionError:
                pass
            return *await figures(), len(reviewer.requests)


async def test_records_of_new_topics_are_counted_and_folded(kafka_bootstrap, redis_url, unique_name):
    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    prefix, group = unique_name("sm"), unique_name("group")
    scores, outcomes, answered = await _run(kafka_bootstrap, redis_url, topics, prefix, group, unique_name("rev"),
                                            0, 300, 0)
    assert scores == 300 and outcomes == answered >= 10
    renamed = {**topics, "scores": unique_name("scores2"), "labels": unique_name("labels2")}
    await create_topics(kafka_bootstrap, [renamed["scores"], renamed["labels"]], partitions=1)
    scores, outcomes_after, answered_after = await _run(kafka_bootstrap, redis_url, renamed, prefix, group,
                                                        unique_name("rev2"), 300, 200, outcomes)
    assert scores == 500  # before: 300, the new topic's offsets 0-199 under the old one's
    assert outcomes_after - outcomes == answered_after  # before: the first answers on the new topic lost


async def test_a_log_that_started_again_under_the_same_name_is_reported(redis_url, unique_name, caplog):
    """The same topic name, its log started again (created again, another cluster's): the new
    records up to the old offsets read as replays.  Not counted (the partition's reported end can
    lag after a leader change, and a replay counted twice would break exactly-once) but logged
    once, as an error naming the remedy."""
    import numpy as np
    from redis.asyncio import Redis

    from stratameter.ingest.ingestor import ScoreIngestor
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    ingest = ScoreIngestor(Store(redis, unique_name("restart")), load_settings({"STRATAMETER_REDIS_URL": redis_url}),
                           np.random.default_rng(0))

    async def apply(first: int, n: int, log_end: int) -> int:
        offs = np.arange(first, first + n)
        prepared = await ingest.prepare(0, offs, ["c"] * n, [f"i{o}" for o in offs], np.linspace(0.5, 0.99, n),
                                        np.ones(n, bool), np.full(n, 1_800_000_000_000), [None] * n, log_end=log_end)
        return await ingest.submit(prepared)

    assert await apply(0, 300, 300) == 300
    assert await apply(200, 100, 300) == 0  # a replay: nothing logged
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert await apply(0, 100, 100) == 0  # the log started again: its records read as replays
    assert await apply(100, 100, 200) == 0
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("scores partition 0")
    assert "STRATAMETER_REDIS_KEY_PREFIX" in errors[0]
    await redis.aclose()


async def test_label_answers_of_a_log_that_started_again_are_reported(redis_url, unique_name, caplog):
    """The same for the labels topic: answers up to the old offset come back as LABEL replays, logged once."""
    from redis.asyncio import Redis

    from stratameter.labels.folder import LabelFolder
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("labels"))
    await redis.hset(store.keys.meta("c"), "first_seen_ms", 1)
    folder = LabelFolder(store.requests)

    async def fold(first: int, n: int, log_end: int) -> list[str]:
        offs = list(range(first, first + n))
        return [o.outcome for o in await folder.apply(0, offs, [f"c/none{o}" for o in offs], [True] * n, [None] * n,
                                                      log_end)]

    assert await fold(0, 20, 20) == ["unknown"] * 20
    assert await fold(10, 10, 20) == ["replay"] * 10  # a replay: nothing logged
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert await fold(0, 5, 5) == ["replay"] * 5  # the log started again
    assert await fold(5, 5, 10) == ["replay"] * 5
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].startswith("labels partition 0") and "started again" in errors[0]
    await redis.aclose()
