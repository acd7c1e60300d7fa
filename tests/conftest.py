"""Shared pytest fixtures: real Kafka-protocol broker and Redis for integration tests.

The suite's folders: ``unit`` (no broker, no Redis, no Label Studio: ``make test-unit``),
``integration`` (Redis), ``system`` (the broker, Redis and the service), ``e2e`` (Label Studio,
a browser, Helm, the demo, the wheel).  Each test is marked by its folder, and by the backend
fixtures it uses (`pytest_collection_modifyitems`); this file imports no backend at collection,
so the unit tests collect in a second.

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
* ``label_studio`` (session, registered by ``tests/e2e/conftest.py``): a real Label Studio
  (``tests/label_studio_harness.py``), started on first use.
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

if TYPE_CHECKING:
    from stratameter.embedded import EmbeddedKafka, EmbeddedKafkaProxy, EmbeddedRedis
    from stratameter.state.store import Store
    from tests.harness import RedisBackend

#: The folders of the suite and the marker each one's tests get (`make test-unit` runs `unit`).
FOLDER_MARKERS = ("unit", "integration", "system", "e2e")
#: Fixtures that start a backend: a test that uses one is marked `integration` (Redis alone) or
#: `system` (the broker) wherever it lives, so `-m unit` never waits on a server.
REDIS_FIXTURES = frozenset({"redis_url", "redis_cluster_url", "redis_backend", "embedded_redis", "store"})
BROKER_FIXTURES = frozenset({"kafka_bootstrap", "kafka_proxy"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Markers by folder (``tests/<folder>/``) and by the backend fixtures a test uses."""
    for item in items:
        parts = item.path.parts
        folder = parts[parts.index("tests") + 1] if "tests" in parts else ""
        if folder in FOLDER_MARKERS:
            item.add_marker(folder)
        used = set(getattr(item, "fixturenames", ()))
        if used & BROKER_FIXTURES:
            item.add_marker("system")
        elif used & REDIS_FIXTURES:
            item.add_marker("integration")


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
    from stratameter.embedded import EmbeddedKafka

    yield from _external_or_embedded("STRATAMETER_TEST_KAFKA", EmbeddedKafka, lambda kafka: kafka.bootstrap)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    from stratameter.embedded import EmbeddedRedis

    yield from _external_or_embedded("STRATAMETER_TEST_REDIS_URL", EmbeddedRedis, lambda redis: redis.url)


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    from stratameter.embedded import EmbeddedRedisCluster

    yield from _external_or_embedded("STRATAMETER_TEST_REDIS_CLUSTER_URL", EmbeddedRedisCluster,
                                     lambda cluster: cluster.url)


@pytest.fixture(params=["redis", "cluster"])
def redis_backend(request: pytest.FixtureRequest) -> RedisBackend:
    from tests.harness import RedisBackend

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
    from stratameter.embedded import EmbeddedKafkaProxy

    with EmbeddedKafkaProxy(kafka_bootstrap) as proxy:
        yield proxy


@pytest.fixture
def embedded_redis() -> Iterator[EmbeddedRedis]:
    from stratameter.embedded import EmbeddedRedis

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
