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


async def _stops_at_the_gap(running) -> None:
    """100 scores more: the process meets the state gone back and stops with `StateRolledBack`
    before it commits past the gap."""
    await _send(running, 500, 100)
    ended, _ = await asyncio.wait(running.tasks, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert ended and all(isinstance(t.exception(), StateRolledBack) for t in ended)
    assert await _committed(running) == 500  # nothing committed past the gap


async def _restart_counts_600(env: dict, kafka_bootstrap: str) -> None:
    """The restart replays from where the state went back: every score counted once."""
    async with serving_env(env, kafka_bootstrap) as running:
        await wait_for(lambda: _all(running, 600), 30, "every score counted once")
        await asyncio.sleep(1)
        assert await _counted(running) == (600, 600)


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


@pytest.mark.parametrize("marks_went_back,slow_check", [(True, False), (False, False), (False, True)],
                         ids=["one-redis", "marks-on-another-node", "slow-assignment-check"])
async def test_a_running_service_stops_on_a_rolled_back_redis_and_its_restart_replays(kafka_bootstrap, unique_name,
                                                                                      marks_went_back, slow_check,
                                                                                      monkeypatch):
    """`marks-on-another-node`: the applied marks kept as they were while the classifiers' state
    went back, as in a Redis Cluster whose ``{_global}`` node did not fail over: the process lowers
    the partition's mark to where the classifier's state went back before it stops.
    `slow-assignment-check`: the check at assignment takes a second (thousands of classifiers, a
    slow Redis) while aiokafka already hands out the records from the committed offsets; before the
    partitions were paused meanwhile, the restart applied those first, and the replay of the gap
    below them then read as replays: 400 of 600 counted, all 600 committed."""
    if slow_check:
        from stratameter.app.state_watch import StateWatch

        check = StateWatch._marks_gone_back

        async def slow(self, tps):
            await asyncio.sleep(1)
            return await check(self, tps)

        monkeypatch.setattr(StateWatch, "_marks_gone_back", slow)
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
            await _stops_at_the_gap(running)
        await client.aclose()
        await _restart_counts_600(env, kafka_bootstrap)


async def _classifiers_back_to_the_snapshot(redis: EmbeddedRedis, client: Redis, prefix: str) -> Redis:
    """`redis` restarted from its snapshot (the classifiers' state of 300) with every ``{_global}``
    key under `prefix` put back as it was: in a Redis Cluster, the classifiers' nodes went back and
    the node of the marks did not.  Returns a client of the restarted Redis (`client` is closed)."""
    names = [k async for k in client.scan_iter(match=f"{prefix}:{{_global}}:*")]
    kept = [(k, await client.pttl(k), await client.dump(k)) for k in names]
    await client.aclose()
    redis.stop()
    redis.start()
    client = Redis.from_url(redis.url)
    for name, ttl, value in kept:
        await client.restore(name, max(ttl, 0), value, replace=True)
    return client


async def test_a_start_replays_a_classifier_whose_node_went_back_while_the_marks_node_did_not(kafka_bootstrap,
                                                                                          unique_name):
    """A Redis Cluster whose classifiers' nodes went back (a replica promoted before it had the last
    writes) while the ``{_global}`` node, with the applied marks, did not, and no process running
    to meet it: the marks equal the committed offsets, so they replay nothing; the classifiers'
    acknowledged offsets kept beside the marks (``Keys.acknowledged``) do.  Before: (300, 300) for
    good."""
    topics = await service_topics(kafka_bootstrap, unique_name, 2)
    with EmbeddedRedis() as redis:
        env = service_env(kafka_bootstrap, redis.url, topics, unique_name)
        client = Redis.from_url(redis.url)
        async with serving_env(env, kafka_bootstrap) as running:
            await _snapshot_of_300_then_500(running, client)
        client = await _classifiers_back_to_the_snapshot(redis, client, env["REDIS_KEY_PREFIX"])
        async with serving_env(env, kafka_bootstrap) as running:
            await wait_for(lambda: _all(running, 500), 30, "the 200 the classifiers' nodes lost counted again")
            await asyncio.sleep(1)
            assert await _counted(running) == (500, 500)
            assert running.service.state_watch.rollbacks >= 1 and running.service.state_watch.losses == 0
        await client.aclose()


async def test_a_process_that_never_wrote_a_classifier_stops_when_its_node_goes_back(kafka_bootstrap, unique_name):
    """The same, with a process running on the partitions when the classifiers' nodes go back, one
    that has not written them yet (it started after their last scores): it knows what their guards
    acknowledged from the copy it read at assignment, so their next score stops it before it
    counts past the gap, and its restart replays.  Before: the 200 never counted."""
    topics = await service_topics(kafka_bootstrap, unique_name, 2)
    with EmbeddedRedis() as redis:
        env = service_env(kafka_bootstrap, redis.url, topics, unique_name)
        client = Redis.from_url(redis.url)
        async with serving_env(env, kafka_bootstrap) as running:
            await _snapshot_of_300_then_500(running, client)
        async with serving_env(env, kafka_bootstrap) as running:
            await wait_for(lambda: _assigned(running), 30, "the partitions assigned")
            client = await _classifiers_back_to_the_snapshot(redis, client, env["REDIS_KEY_PREFIX"])
            await _stops_at_the_gap(running)
        await client.aclose()
        await _restart_counts_600(env, kafka_bootstrap)


async def _assigned(running) -> bool:
    return bool(running.service.consumer.assignment())


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

    folder = LabelFolder(store.requests)
    assert await fold(folder, 0, 10) == ["unknown"] * 10  # no such requests: counted, their offsets applied
    await redis.hset(store.keys.labels_offsets("c"), "0", 4)  # Redis went back
    with pytest.raises(StateRolledBack):
        await fold(folder, 10, 1)
    assert int(await redis.hget(store.keys.labels_offsets("c"), "0")) == 4  # nothing folded past the gap
    assert await fold(LabelFolder(store.requests), 5, 6) == ["unknown"] * 6  # the restart's replay
    await redis.aclose()


async def test_service_wide_counts_stop_at_a_state_gone_back(redis_url, unique_name):
    """The invalid-record counts' offset guard (GLOBAL_COUNT) below the offset it acknowledged:
    before, the refusal was taken for another writer's and the counts went on from there."""
    from stratameter.app.batch import GlobalCounts
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    store = Store(redis, unique_name("counts"))
    counts = GlobalCounts(store.offsets)
    await counts.add_invalid("scores", 0, {3: "bad_json", 9: "bad_json"}, 9)
    assert (await store.offsets.invalid_counts())[("scores", "bad_json")] == 2
    await redis.hset(store.keys.global_offsets("scores"), "0", 4)  # Redis went back
    with pytest.raises(StateRolledBack):
        await counts.add_invalid("scores", 0, {12: "bad_json"}, 12)
    assert int(await redis.hget(store.keys.global_offsets("scores"), "0")) == 4
    await redis.aclose()


class _Consumer:
    """What `StateWatch.replay_rolled_back` asks the consumer: committed offsets, the seeks, and
    the partitions paused while it decides."""

    def __init__(self, committed: int) -> None:
        self.consumer, self._committed, self.seeks = self, committed, {}
        self.paused: set = set()
        self.owned: set = set()

    async def committed(self, tp) -> int:
        assert tp in self.paused  # nothing is handed out before the seek
        return self._committed

    def seek(self, tp, offset: int) -> None:
        assert tp in self.paused
        self.seeks[tp] = offset

    def pause(self, *tps) -> None:
        self.paused.update(tps)

    def resume(self, *tps) -> None:
        self.paused.difference_update(tps)

    def assignment(self) -> set:
        return self.owned


async def test_assignment_replays_a_labels_partition_from_the_lowest_state_gone_back(redis_url, unique_name):
    """The acknowledged offsets of both topics and of a classifier's predicted negatives: a labels
    partition is read again from the lowest offset after what a state holds below its
    acknowledged one; states that hold theirs are noted for this process, and a state holding no
    offset there (forgotten) is not replayed."""
    from aiokafka import TopicPartition

    from stratameter.app.batch import BatchHandler, GlobalCounts
    from stratameter.app.state_watch import StateWatch
    from stratameter.ingest.ingestor import ScoreIngestor
    from stratameter.labels.folder import LabelFolder
    from stratameter.state.keys import negatives_of
    from stratameter.state.process import ProcessState
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_REDIS_KEY_PREFIX": unique_name("ack")})
    store = Store(redis, settings.redis_key_prefix)
    for cid in ("a", "b", "gone"):
        await redis.sadd(store.keys.classifiers, cid)
    await store.offsets.note_acknowledged({"a": {"labels:0": 20, "scores:0": 50}, negatives_of("a"): {"labels:0": 30},
                                           "b": {"labels:0": 12}, "gone": {"labels:0": 99}})
    await redis.hset(store.keys.labels_offsets("a"), "0", 20)  # held
    await redis.hset(store.keys.labels_offsets(negatives_of("a")), "0", 17)  # went back: from 18
    await redis.hset(store.keys.labels_offsets("b"), "0", 9)  # went back: from 10, the lowest
    await redis.hset(store.keys.scores_offsets("a"), "0", 50)  # held
    process = ProcessState()
    folder, ingestor = LabelFolder(store.requests), ScoreIngestor(store, settings)
    batches = BatchHandler(settings, ingestor, folder, GlobalCounts(store.offsets), None, asyncio.Event(),
                           store.registry, process)
    kafka = _Consumer(committed=0)  # the marks have nothing to replay
    watch = StateWatch(store, process, settings, kafka, batches)
    labels, scores = TopicPartition(settings.topic_labels, 0), TopicPartition(settings.topic_scores, 0)
    kafka.owned = {labels, scores}
    await watch.replay_rolled_back([labels, scores])
    assert kafka.seeks == {labels: 10} and watch.rollbacks == 1
    assert kafka.paused == set()  # resumed once decided
    assert folder.acknowledged.get(("a", 0)) == 20 and ingestor.acknowledged.get(("a", 0)) == 50
    assert folder.acknowledged.get(("b", 0)) == -1  # went back: its replay must not be refused
    assert folder.acknowledged.get(("gone", 0)) == -1
    assert folder.acknowledged.take() == {} == ingestor.acknowledged.take()  # seeds are not copied back
    await redis.aclose()
