"""Redis losing the state (`app.state_watch`): a Redis without persistence restarted, or the keys
deleted, while Kafka's committed offsets live on.

Before the watch, the service went on from its committed offsets without a word: the chunk under
way held only the records after the loss, was invisible to the loop and the API for the rest of
its length (its meta, the strata, was gone while the ingestor's cache still had them), and a start
on an emptied Redis reported the next partial chunk as if it were whole.  Against the real broker
and Redis: the loss seen at start (and not on a first start, a restart or an upgrade), and while
running (the chunk under way reported incomplete with no estimate and no request, the next chunk
converging on its truth).
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import orjson
from aiokafka import AIOKafkaProducer
from redis.asyncio import Redis

from stratameter.config import load_settings
from stratameter.embedded import find_free_port, group_consumer
from stratameter.state.keys import Keys
from tests.harness import Reviewer, service_topics, serving, wait_for

SKEW_S = 2


def _env(kafka_bootstrap: str, redis_url: str, topics: dict, group: str, prefix: str, **more: str) -> dict:
    return {"STRATAMETER_" + k: v for k, v in {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap, "KAFKA_CONSUMER_GROUP": group, "KAFKA_SESSION_TIMEOUT_MS": "6000",
        "REDIS_URL": redis_url, "REDIS_KEY_PREFIX": prefix, "TOPIC_SCORES": topics["scores"],
        "TOPIC_LABEL_REQUESTS": topics["requests"], "TOPIC_LABELS": topics["labels"],
        "TOPIC_DEAD_LETTER": topics["dlq"], "MAX_EVENT_TIME_SKEW_SECONDS": str(SKEW_S), **more}.items()}


async def _started(env: dict):
    from stratameter.app.runner import Service

    service = Service(load_settings(env))
    await service.start()
    await service.stop()
    return service


async def test_a_start_sees_a_state_lost_while_the_service_was_away(kafka_bootstrap, redis_url, unique_name):
    topics = await service_topics(kafka_bootstrap, unique_name, 2)
    group = unique_name("group")
    env = lambda prefix: _env(kafka_bootstrap, redis_url, topics, group, prefix)  # noqa: E731
    first = await _started(env(unique_name("first")))  # a first start: nothing consumed yet
    assert first.state_watch.losses == 0 and first.process.lost_through_ms is None
    # the group consumes and commits a record of the scores topic
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    await producer.send_and_wait(topics["scores"], b"{}", partition=1)
    await producer.stop()
    async with group_consumer(topics["scores"], bootstrap_servers=kafka_bootstrap, group_id=group) as consumer:
        await consumer.getone()
        await consumer.commit()
    # then Redis holds nothing for the service any more (a prefix never written stands for it)
    lost_prefix = unique_name("lost")
    before = int(time.time() * 1000)
    lost = await _started(env(lost_prefix))
    assert lost.state_watch.losses == 1
    through = lost.process.lost_through_ms
    assert before + 1000 * SKEW_S <= through <= int(time.time() * 1000) + 1000 * SKEW_S
    again = await _started(env(lost_prefix))  # restarted on the state since: noted once
    assert again.state_watch.losses == 0 and again.process.lost_through_ms == through
    # a state written before the note (classifiers, no `started_ms`): an upgrade, not a loss
    redis = Redis.from_url(redis_url)
    upgraded = unique_name("upgraded")
    await redis.sadd(Keys(upgraded).classifiers, "c")
    older = await _started(env(upgraded))
    assert older.state_watch.losses == 0 and older.process.lost_through_ms is None
    await redis.aclose()


def _population(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    score = rng.beta(2, 2, n)
    return score, rng.random(n) < score


async def _delete_state(redis: Redis, prefix: str) -> int:
    keys = [k async for k in redis.scan_iter(match=f"{prefix}:*", count=1000)]
    return await redis.delete(*keys) if keys else 0


async def test_a_state_lost_while_running_leaves_the_chunk_under_way_incomplete(kafka_bootstrap, redis_url,
                                                                                 unique_name):
    """Chunk A (20 s) gets half its records, the state is deleted, A gets the rest; chunk B starts
    after the loss.  A is reported incomplete (no estimate, no request after the loss), B
    converges and covers its truth; the loss is counted once."""
    from stratameter.app.runner import Service

    topics = await service_topics(kafka_bootstrap, unique_name, 1)
    prefix = unique_name("sm")
    port = find_free_port()
    service = Service(load_settings(_env(
        kafka_bootstrap, redis_url, topics, unique_name("group"), prefix, HTTP_PORT=str(port), CHUNK_SECONDS="20",
        ALLOWED_LATENESS_SECONDS="600", DELTA="0.1", CONFIDENCE="0.999", MAX_LABELS_PER_HOUR="20000")))
    a_score, a_y = _population(600, 1)
    b_score, b_y = _population(1500, 2)
    redis = Redis.from_url(redis_url)
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
    await producer.start()
    async with serving(service, port, topics, producer, kafka_bootstrap) as running:
        chunk_a = int(time.time()) // 20
        a_ms = chunk_a * 20_000 + 500

        async def doc():
            status, body = await running.get("/v1/classifiers/c")
            return orjson.loads(body) if status == 200 else None

        async def send(kind, score, first, ms):
            for i, s in enumerate(score):
                await running.send_score(classifier_id="c", item_id=f"{kind}{first + i}", score=float(s),
                                         event_time=ms)
            await producer.flush()

        await send("a", a_score[:300], 0, a_ms)
        await wait_for(lambda: _scores(doc, 300), 60, "the first half of A")
        assert await _delete_state(redis, prefix) > 0
        await wait_for(lambda: _metric(running, "stratameter_redis_state_lost_total"), 30, "the loss seen")
        lost_through = service.process.lost_through_ms
        assert lost_through is not None and lost_through >= chunk_a * 20_000
        await send("a", a_score[300:], 300, a_ms)
        chunk_b = lost_through // 20_000 + 1  # the first chunk starting after the mark
        await asyncio.sleep(max(0.0, chunk_b * 20 + 0.5 - time.time()))  # its records come once it has started
        await send("b", b_score, 0, chunk_b * 20_000 + 500)

        def answer(req):
            kind, i = req["item_id"][0], int(req["item_id"][1:])
            return bool((a_y if kind == "a" else b_y)[i])

        async with Reviewer(running, unique_name("rev"), answer):
            final = await wait_for(lambda: _converged(doc, chunk_b * 20), 150, "chunk B converged")
        body = (await running.get("/metrics"))[1].decode()
    await redis.aclose()
    a_doc = next(h for h in final["history"] if h["chunk"]["start"] == _iso(chunk_a * 20))
    assert a_doc["complete"] is False and a_doc["estimate"] is None
    assert a_doc["metrics"]["precision"]["estimate"] is None
    assert a_doc["population"] == int(np.sum(a_score[300:] >= 0.5))  # reopened, counted from the loss
    assert a_doc["labels"] == 0
    assert final["complete"] is True and final["status"] == "converged"
    assert final["population"] == int(np.sum(b_score >= 0.5))
    pred = b_score >= 0.5
    truth = float(np.mean(b_y[pred]))
    assert final["ci_lower"] <= truth <= final["ci_upper"], (truth, final)
    assert "stratameter_redis_state_lost_total 1.0" in body


async def _scores(doc, n: int):
    d = await doc()
    return d if d and d["scores"] >= n else None


async def _metric(running, name: str):
    status, body = await running.get("/metrics")
    return status == 200 and f"{name} 1.0" in body.decode()


async def _converged(doc, start_s: int):
    d = await doc()
    return d if d and d["chunk"] and d["chunk"]["start"] == _iso(start_s) and d["status"] == "converged" else None


def _iso(seconds: int) -> str:
    from stratameter.api.views import _iso as iso

    return iso(seconds)


async def test_ingest_opens_a_chunk_again_whose_state_is_gone(redis_url, unique_name):
    """The ingestor's cache still has the chunk's strata; INGEST refuses the chunk with none
    stored (before: it counted into a chunk without strata, which no reader lists), and the
    ingestor opens it again."""
    from stratameter.ingest.ingestor import ScoreIngestor
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    prefix = unique_name("gone")
    store = Store(redis, prefix)
    ingest = ScoreIngestor(store, load_settings({"STRATAMETER_REDIS_URL": redis_url}), np.random.default_rng(0))
    t0 = 1_800_000_000_000

    def batch(first: int, n: int):
        offs = np.arange(first, first + n)
        return (offs, ["c"] * n, [f"i{o}" for o in offs], np.linspace(0.5, 0.99, n), np.ones(n, bool),
                np.full(n, t0), [None] * n)

    assert await ingest.apply(0, *batch(0, 400)) == 400
    assert await _delete_state(redis, prefix) > 0
    assert await ingest.apply(0, *batch(400, 300)) == 300
    (t,) = await store.chunks.chunk_ids("c")
    (cs,) = await store.chunks.chunk_states("c", [t])
    assert int(cs.N.sum()) == 300 and cs.strata == 4
    await redis.aclose()


async def test_a_loss_notes_the_topics_the_offsets_are_written_under(redis_url, unique_name):
    """A process running on renamed topics keeps its offsets under ``<topic>:<partition>``
    (`app.batch.BatchHandler.offset_field`), also after a loss it saw while running; the next start
    must read the same first topics (before: it noted its own, so their offsets moved to the bare
    partition fields, and the records between the committed and the applied offset were counted
    again)."""
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    prefix = unique_name("topics")
    running = Store(redis, prefix)
    assert await running.registry.noted_topics("scores2", "labels2") == ("scores2", "labels2")
    await redis.hset(Keys(prefix).settings, mapping={"topic_scores": "scores1", "topic_labels": "labels1"})
    first_topics = ("scores1", "labels1")  # what a start on the renamed topics read
    assert await _delete_state(redis, prefix) > 0
    await running.registry.note_state_lost(1_800_000_000_000, 600, 1_800_000_000_000, first_topics)
    assert await Store(redis, prefix).registry.noted_topics("scores2", "labels2") == ("scores1", "labels1")
    await redis.aclose()


class _Group:
    """What `StateWatch.check_at_start` asks Kafka (one scores partition, its committed offset)."""

    def __init__(self, committed: int | None) -> None:
        self.producer, self.consumer = self, self
        self._committed = committed

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def committed(self, tp) -> int | None:
        return self._committed


async def test_a_replica_sees_a_loss_another_start_noted_afresh(redis_url, unique_name):
    """Redis emptied while replica A runs; before A's next probe, A lists a classifier again (its
    batches do every 30 s) and replica B starts: B finds a classifier, so it cannot tell a loss
    from a state it shares, and notes the settings afresh.  A sees their ``started_ms`` changed
    (before: the settings being there, neither replica saw the loss) and B follows A's mark."""
    from stratameter.app.state_watch import StateWatch
    from stratameter.state.process import ProcessState
    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    prefix = unique_name("race")
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_REDIS_KEY_PREFIX": prefix})

    async def started(committed: int | None) -> tuple[ProcessState, StateWatch]:
        store, process = Store(redis, prefix), ProcessState()
        watch = StateWatch(store, process, settings, _Group(committed))
        await store.registry.stored_chunk_seconds(settings.chunk_seconds)  # as the start's checks do first
        await watch.check_at_start()
        return process, watch

    process_a, watch_a = await started(None)  # a first start
    assert watch_a.losses == 0 and process_a.lost_through_ms is None
    await asyncio.sleep(0.01)
    assert await _delete_state(redis, prefix) > 0
    await redis.sadd(Keys(prefix).classifiers, "c")  # A's batches list a classifier again
    process_b, watch_b = await started(42)
    assert watch_b.losses == 0  # B cannot tell
    await watch_a.check()
    assert watch_a.losses == 1 and process_a.lost_through_ms is not None  # before: 0 and None
    await watch_b.check()
    assert process_b.lost_through_ms == process_a.lost_through_ms and watch_b.losses == 0
    await watch_a.check()
    await watch_b.check()
    assert (watch_a.losses, watch_b.losses) == (1, 0)  # seen once
    await redis.aclose()
