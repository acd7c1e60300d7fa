"""Shared pytest fixtures: real Kafka-protocol broker and Redis for integration tests.

* ``kafka_bootstrap`` (session): ``$STRATAMETER_TEST_KAFKA`` (bootstrap servers) if set,
  else an embedded tansu broker (``service.embedded.EmbeddedKafka``), started lazily on
  first use and shared by the whole session.
* ``redis_url`` (session): ``$STRATAMETER_TEST_REDIS_URL`` if set, else an embedded
  redis-server / valkey-server.
* ``unique_name`` (function): a callable, ``unique_name("orders") -> "orders-<test>-<hex>"``,
  valid as a Kafka topic, consumer group or Redis key prefix, different for every call,
  so tests sharing the session backends never collide.
* ``kafka_proxy`` (function): a fresh ``EmbeddedKafkaProxy`` in front of
  ``kafka_bootstrap``; ``.bootstrap`` for clients, ``.stop()``/``.start()`` for outages.
* ``embedded_redis`` (function): a private ``EmbeddedRedis`` (always embedded, even
  when ``$STRATAMETER_TEST_REDIS_URL`` is set) for tests that stop or restart Redis.

Consumers in tests: use ``session_timeout_ms=6000, heartbeat_interval_ms=500`` and call
``service.embedded.leave_group_on_stop(consumer)`` after ``start()`` when another consumer
of the same group starts later (see the tansu notes in ``service/embedded.py``).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator

import pytest

from service.embedded import EmbeddedKafka, EmbeddedKafkaProxy, EmbeddedRedis


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    external = os.environ.get("STRATAMETER_TEST_KAFKA", "").strip()
    if external:
        yield external
        return
    with EmbeddedKafka() as kafka:
        yield kafka.bootstrap


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    external = os.environ.get("STRATAMETER_TEST_REDIS_URL", "").strip()
    if external:
        yield external
        return
    with EmbeddedRedis() as redis:
        yield redis.url


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
