"""Redis going back: it lost writes it had acknowledged (restarted from an older snapshot, or from
an append-only file not yet synced; a replica promoted before it had them), while Kafka kept the
offsets committed after them (`state.offsets.StateRolledBack`).

Before, the service went on from the committed offsets and the records between the snapshot and
the restart were never counted (the first test without the replay: 500 never reached).  Now a start reads each
partition again from the mark Redis kept of what its state applied (`app.state_watch`), and a
running process that meets a state gone back stops before it counts past the gap (the next start
replays).  Against the real broker and a real Redis restarted from a snapshot taken mid-stream.
"""

from __future__ import annotations

import asyncio

import orjson
import pytest
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.embedded import EmbeddedRedis
from stratameter.state.offsets import StateRolledBack
from tests.harness import service_env, service_topics, serving_env, wait_for

CLASSIFIERS = ("c0", "c1", "c2")




async def _send(running, first: int, n: int) -> None:
    for i in range(first, first + n):
        await running.send_score(classifier_id=CLASSIFIERS[i % 3], item_id=f"i{i}", score=0.5 + 0.5 * (i % 10) / 10)
    await running.producer.flush()


async def _counted(running) -> tuple[int, int]:
    """The scores and the population summed over the classifiers, as the API reports them."""
    scores = population = 0
    for cid in CLASSIFIERS:
        status, body = await running.get(f"/v1/classifiers/{cid}")
        if status == 200:
            doc = orjson.loads(body)
            scores, population = scores + doc["scores"], population + doc["population"]
    return scores, population


async def _committed(running) -> int:
    """The offsets the consumer group committed on the scores topic, summed."""
    from aiokafka import TopicPartition

    consumer, topic = running.service.consumer, running.topics["scores"]
    offsets = [await consumer.committed(TopicPartition(topic, p)) for p in sorted(consumer.partitions_for_topic(topic))]
    return sum(o or 0 for o in offsets)


async def _counted_and_committed(running, n: int) -> None:
    await wait_for(lambda: _all(running, n), 30, f"{n} scores counted and committed")


async def _all(running, n: int) -> bool:
    return (await _counted(running))[0] == n and await _committed(running) == n


async def _snapshot_of_300_then_500(running, client: Redis) -> None:
    """300 scores counted and committed, a snapshot taken (`SAVE`), 200 more counted and committed."""
    await _send(running, 0, 300)
    await _counted_and_committed(running, 300)
    await client.save()
    await _send(running, 300, 200)
    await _counted_and_committed(running, 500)


async def test_a_start_replays_what_a_rolled_back_redis_lost(kafka_bootstrap, unique_name):
    topics = await service_topics(kafka_bootstrap, unique_name, 2)
    with EmbeddedRedis() as redis:  # no persistence of its own: SAVE writes the snapshot it restarts from
        env = service_env(kafka_bootstrap, redis.url, topics, unique_name)
        client = Redis.from_url(redis.url)
        async with serving_env(env, kafka_bootstrap) as running:
            await _snapshot_of_300_then_500(running, client)
        await client.aclose()
        redis.stop()
        redis.start()  # the snapshot of 300
        async with serving_env(env, kafka_bootstrap) as running:
            assert running.service.state_watch.losses == 0  # the settings are there: not a loss
            await wait_for(lambda: _all(running, 500), 30, "the 200 Redis lost counted again")
            await asyncio.sleep(1)
            assert await _counted(running) == (500, 500)  # before: (300, 300)
            assert running.service.state_watch.rollbacks >= 1
            status, metrics = await running.get("/metrics")
            assert "stratameter_redis_state_rolled_back_total " in metrics.decode()


@pytest.mark.parametrize("marks_went_back", [True, False], ids=["one-redis", "marks-on-another-node"])
async def test_a_running_service_stops_on_a_rolled_back_redis_and_its_restart_replays(kafka_bootstrap, unique_name,
                                                                                      marks_went_back):
    """`marks-on-another-node`: the applied marks kept as they were while the classifiers' state
    went back, as in a Redis Cluster whose ``{_global}`` node did not fail over: the process lowers
    the partition's mark to where the classifier's state went back before it stops."""
    topics = await service_topics(kafka_bootstrap, unique_name, 2)
    with EmbeddedRedis() as redis:
        env = service_env(kafka_bootstrap, redis.url, topics, unique_name)
        client = Redis.from_url(redis.url)
        async with serving_env(env, kafka_bootstrap) as running:
            await _snapshot_of_300_then_500(running, client)
            applied = running.service.store.keys.applied
            marks = await client.hgetall(applied)
            redis.stop()
            redis.start()  # under the running service: the snapshot of 300
            await client.aclose()
            client = Redis.from_url(redis.url)
            if not marks_went_back:
                await client.hset(applied, mapping=marks)
            await _send(running, 500, 100)
            ended, _ = await asyncio.wait(running.tasks, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            assert ended and all(isinstance(t.exception(), StateRolledBack) for t in ended)
            assert await _committed(running) == 500  # nothing committed past the gap
        await client.aclose()
        async with serving_env(env, kafka_bootstrap) as running:
            await wait_for(lambda: _all(running, 600), 30, "every score counted once")
            await asyncio.sleep(1)
            assert await _counted(running) == (600, 600)


async def test_label_answers_stop_at_a_state_gone_back(redis_url, unique_name):
    """LABEL refuses an answer whose state holds a labels offset below the one this process saw
    applied (before: it was folded and the offset jumped over the answers Redis lost, so the replay
    from the mark skipped them); a process that saw nothing applied yet folds the replay."""
    import numpy as np

    from stratameter.ingest.ingestor import ScoreIngestor
    from stratameter.labels.folder import LabelFolder
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("labels"))
    ingest = ScoreIngestor(store, load_settings({"STRATAMETER_REDIS_URL": redis_url}), np.random.default_rng(0))
    offs = np.arange(100)
    await ingest.apply(0, offs, ["c"] * 100, [f"i{o}" for o in offs], np.linspace(0.5, 0.99, 100), np.ones(100, bool),
                       np.full(100, 1_800_000_000_000), [None] * 100)  # the classifier's state

    async def fold(folder: LabelFolder, first: int, n: int) -> list[str]:
        return [o.outcome for o in await folder.apply(0, range(first, first + n), [f"c/t{i}" for i in range(n)],
                                                      [True] * n, [None] * n)]

    folder = LabelFolder(store)
    assert await fold(folder, 0, 10) == ["unknown"] * 10  # no such requests: counted, their offsets applied
    await redis.hset(store.keys.labels_offsets("c"), "0", 4)  # Redis went back
    with pytest.raises(StateRolledBack):
        await fold(folder, 10, 1)
    assert int(await redis.hget(store.keys.labels_offsets("c"), "0")) == 4  # nothing folded past the gap
    assert await fold(LabelFolder(store), 5, 6) == ["unknown"] * 6  # the restart's replay
    await redis.aclose()


async def test_service_wide_counts_stop_at_a_state_gone_back(redis_url, unique_name):
    """The invalid-record counts' offset guard (GLOBAL_COUNT) below the offset it acknowledged:
    before, the refusal was taken for another writer's and the counts went on from there."""
    from stratameter.app.batch import GlobalCounts
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("counts"))
    counts = GlobalCounts(store)
    await counts.add_invalid("scores", 0, {3: "bad_json", 9: "bad_json"}, 9)
    assert (await store.invalid_counts())[("scores", "bad_json")] == 2
    await redis.hset(store.keys.global_offsets("scores"), "0", 4)  # Redis went back
    with pytest.raises(StateRolledBack):
        await counts.add_invalid("scores", 0, {12: "bad_json"}, 12)
    assert int(await redis.hget(store.keys.global_offsets("scores"), "0")) == 4
    await redis.aclose()
