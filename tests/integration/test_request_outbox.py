"""A request-loop step cut short by Redis or Kafka leaves nothing stuck.

The loop records a round's requests in Redis (ISSUE, the outbox), publishes them, then marks
them published.  When Redis goes away mid-step (a master SIGKILLed, a failover) ISSUE may have
been applied with its reply lost, or not applied at all; when Kafka refuses, the requests are
recorded but not published.  Either way the next pass must publish what was recorded and
plan again: a recorded request nobody publishes is pending until its label timeout (a day by
default) and blocks every later round of its chunk.  Real Redis; the Kafka producer is a
stand-in that records what it is given (these are unit tests of one pass of the loop)."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from stratameter.app.failures import ClassifierFailures
from stratameter.app.ownership import Leases
from stratameter.app.probes import Health
from stratameter.app.request_task import RequestTask
from stratameter.config import load_settings
from stratameter.ingest.ingestor import ScoreIngestor
from stratameter.state.process import ProcessState
from stratameter.state.request_store import RequestStore
from stratameter.state.store import Store

pytestmark = pytest.mark.integration


class _Producer:
    """Records (topic, key, value); `refuse` sends fail with an OSError, as a broker that is down."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, bytes]] = []
        self.refuse = 0

    async def send(self, topic: str, value: bytes, key: bytes):
        if self.refuse:
            self.refuse -= 1
            raise OSError("broker unavailable")
        self.sent.append((topic, key, value))
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class _Kafka:
    def __init__(self) -> None:
        self.producer = _Producer()


class _FlakyRequests(RequestStore):
    """A requests port whose next ISSUE fails with a lost connection, after (`applied`) or before reaching Redis."""

    fail_next_issue: str | None = None  # "applied" | "not_applied"

    async def issue(self, *args, **kwargs):
        mode, self.fail_next_issue = self.fail_next_issue, None
        if mode == "not_applied":
            raise RedisConnectionError("connection lost before the reply")
        issued = await super().issue(*args, **kwargs)
        if mode == "applied":
            raise RedisConnectionError("connection lost after ISSUE was applied")
        return issued


async def _task(redis_url: str, prefix: str):
    settings = load_settings({"STRATAMETER_REDIS_URL": redis_url, "STRATAMETER_INSTANCE_ID": "me",
                              "STRATAMETER_MAX_LABELS_PER_HOUR": "100000"})
    redis = Redis.from_url(redis_url)
    store = Store(redis, prefix)
    store.requests = _FlakyRequests(store.connection)
    ingest = ScoreIngestor(store, settings, np.random.default_rng(0))
    n, rng = 3000, np.random.default_rng(1)
    now_ms = int(time.time() * 1000)
    await ingest.apply(0, np.arange(n), ["c"] * n, [f"i{j}" for j in range(n)], rng.random(n), np.ones(n, bool),
                       np.full(n, now_ms), [None] * n)  # a stream that just started: the loop paces requests
    leases = Leases(store.registry, settings.instance_id)
    await leases.renew()
    assert leases.owned == {"c"}
    kafka = _Kafka()
    task = RequestTask(store, ProcessState(), settings, kafka, leases, Health(), asyncio.Event(), asyncio.Event(),
                       ClassifierFailures())
    return task, store, kafka.producer, redis


def _published(producer: _Producer) -> set[str]:
    import orjson
    return {orjson.loads(value)["request_id"] for _, _, value in producer.sent}


async def _pending(store: Store) -> set[str]:
    return {r.decode() for r in await store.redis.zrange(store.keys.pending("c"), 0, -1)}


@pytest.mark.parametrize("failure", ["applied", "not_applied"])
async def test_a_step_cut_short_by_redis_publishes_and_plans_on_the_next_pass(redis_url, unique_name, failure):
    task, store, producer, redis = await _task(redis_url, unique_name("outbox"))
    store.requests.fail_next_issue = failure
    await task._pass()  # ISSUE fails: nothing is published
    assert producer.sent == []
    recorded = await _pending(store)
    assert bool(recorded) == (failure == "applied")
    await task._pass()
    published = _published(producer)
    assert published, "the next pass must request labels"
    assert recorded <= published, "requests recorded by the cut-short step must be published"
    assert await store.requests.unpublished("c") == []
    assert await _pending(store) == published
    await redis.aclose()


async def test_requests_kafka_refused_are_published_on_the_next_pass(redis_url, unique_name):
    task, store, producer, redis = await _task(redis_url, unique_name("outbox"))
    producer.refuse = 1
    await task._pass()
    recorded = await _pending(store)
    assert recorded and producer.sent == []
    await task._pass()
    assert recorded <= _published(producer)
    assert await store.requests.unpublished("c") == []
    await redis.aclose()
