"""Shared pytest fixtures: real Kafka-protocol broker and Redis for integration tests.

* ``kafka_bootstrap`` (session): ``$STRATAMETER_TEST_KAFKA`` (bootstrap servers) if set,
  else an embedded tansu broker (``stratameter.embedded.EmbeddedKafka``), started lazily on
  first use and shared by the whole session.
* ``redis_url`` (session): ``$STRATAMETER_TEST_REDIS_URL`` if set, else an embedded
  redis-server / valkey-server.
* ``redis_cluster_url`` (session): ``$STRATAMETER_TEST_REDIS_CLUSTER_URL`` (any node) if set,
  else an embedded three-master cluster (``stratameter.embedded.EmbeddedRedisCluster``),
  started on first use.
* ``redis_backend`` (function, parametrized ``redis`` / ``cluster``): a `harness.RedisBackend`, for
  the integration tests that run against both a single Redis and a Redis Cluster:
  ``.url``, ``.cluster``, ``.settings`` (``REDIS_URL`` and ``REDIS_CLUSTER`` for the
  service) and ``.client()`` (``Redis`` or ``RedisCluster``).
* ``unique_name`` (function): a callable, ``unique_name("orders") -> "orders-<test>-<hex>"``,
  valid as a Kafka topic, consumer group or Redis key prefix, different for every call,
  so tests sharing the session backends never collide.
* ``kafka_proxy`` (function): a fresh ``EmbeddedKafkaProxy`` in front of
  ``kafka_bootstrap``; ``.bootstrap`` for clients, ``.stop()``/``.start()`` for outages.
* ``embedded_redis`` (function): a private ``EmbeddedRedis`` (always embedded, even
  when ``$STRATAMETER_TEST_REDIS_URL`` is set) for tests that stop or restart Redis.
* ``label_studio`` (session): a real Label Studio (``tests/label_studio_harness.py``), started on
  first use.
* ``store`` (function): a ``Store`` on ``redis_url`` under a fresh key prefix
  (``store.redis`` is its client, closed after the test).

Consumers in tests: ``stratameter.embedded.group_consumer`` (or ``start_group_consumer``) sets
``session_timeout_ms=6000, heartbeat_interval_ms=500`` and calls ``leave_group_on_stop``,
which a consumer needs when another consumer of the same group starts later (see the
tansu notes in ``service/embedded/broker.py``).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING

import pytest

from stratameter.embedded import EmbeddedKafka, EmbeddedKafkaProxy, EmbeddedRedis, EmbeddedRedisCluster
from tests.harness import RedisBackend
from tests.label_studio_harness import label_studio  # noqa: F401  (registered here, once a session)

if TYPE_CHECKING:
    from stratameter.state.store import Store


def _external_or_embedded(variable: str, embedded: Callable[[], EmbeddedKafka | EmbeddedRedis],
                          address: Callable[[EmbeddedKafka | EmbeddedRedis], str]) -> Iterator[str]:
    """The address in ``$variable`` if set, else that of a backend started for the session."""
    external = os.environ.get(variable, "").strip()
    if external:
        yield external
        return
    with embedded() as backend:
        yield address(backend)


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    yield from _external_or_embedded("STRATAMETER_TEST_KAFKA", EmbeddedKafka, lambda kafka: kafka.bootstrap)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    yield from _external_or_embedded("STRATAMETER_TEST_REDIS_URL", EmbeddedRedis, lambda redis: redis.url)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    yield from _external_or_embedded("STRATAMETER_TEST_REDIS_CLUSTER_URL", EmbeddedRedisCluster,
                                     lambda cluster: cluster.url)


@pytest.fixture(params=["redis", "cluster"])
def redis_backend(request: pytest.FixtureRequest) -> RedisBackend:
    if request.param == "cluster":
        return RedisBackend(request.getfixturevalue("redis_cluster_url"), True)
    return RedisBackend(request.getfixturevalue("redis_url"), False)


@pytest.fixture
def unique_name(request: pytest.FixtureRequest) -> Callable[[str], str]:
    test = re.sub(r"[^A-Za-z0-9_]+", "_", request.node.name).strip("_")[:60] or "test"

    def make(prefix: str = "t") -> str:
        prefix = re.sub(r"[^A-Za-z0-9._-]+", "_", prefix)[:60]
        return f"{prefix}-{test}-{uuid.uuid4().hex[:10]}"

    return make


@pytest.fixture
def kafka_proxy(kafka_bootstrap: str) -> Iterator[EmbeddedKafkaProxy]:
    with EmbeddedKafkaProxy(kafka_bootstrap) as proxy:
        yield proxy


@pytest.fixture
def embedded_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis() as redis:
        yield redis


@pytest.fixture
async def store(redis_url: str, unique_name: Callable[[str], str]) -> AsyncIterator[Store]:
    from redis.asyncio import Redis

    from stratameter.state.store import Store

    redis = Redis.from_url(redis_url)
    try:
        yield Store(redis, unique_name("store"))
    finally:
        await redis.aclose()
