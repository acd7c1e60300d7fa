"""The ingestion benchmark behind `stratameter bench` (its records: `records`; what it reports:
`result`).

One run:

1. produce ``records`` score records once to a fresh topic with ``partitions``
   partitions (key = classifier_id, a classifier's records in one partition, as
   with Kafka's default partitioner); ``predicted_positive`` omitted (the service
   applies the 0.5 threshold), ``event_time`` in epoch ms inside the current chunk and
   not after the moment they are generated (so the service accepts every one of them:
   none in the future, none for a closed chunk), a small ``context`` object;
2. the service ingests them once, untimed (step 5 with a consumer group and keys of its own): in
   a process that has not, the bare consumers read 30-45% slower (2026-11-27: the bare decode
   297,000-366,000 records/s against 461,000-468,000 after this warm-up), and a single run compared
   them with a warmer service (its ratio read 0.81-0.93 there, 0.57-0.81 with the warm-up);
3. a bare aiokafka consumer (manually assigned, no group) reads them all without
   decoding: the raw rate;
4. the same, ``orjson.loads`` on every value: the bare decode rate, the standing bar's reference;
   and once more taking aiokafka's own record objects as the service does (`app.records`), the
   same consumer without aiokafka's `ConsumerRecord` wrapping: a reference the service's own
   read cannot beat;
5. a `stratameter.app.runner.Service` with a fresh consumer group consumes the topic
   (`consume_forever`, the ingest path; no request loop, no HTTP) until the
   classifiers' ``scores_total`` in Redis add up to ``records``.  On the way, when
   ``memory_at`` records are counted (default: a fifth and a half of them), and at the end, the Redis memory of each
   classifier's keys is measured (``MEMORY USAGE key SAMPLES 0``).

With ``repeat`` > 1, steps 3-5 (and the every-metric and cluster ingests) run that many times
in turn on the same records, and the rates and ratios reported are medians: one ingest of the
default bench lasts about two seconds, and on a small machine a neighbour's burst moves a
single reading by a tenth or more.  The every-metric ingest runs after precision's in the odd
repeats (the first, third, ...) and before it in the even ones, so that neither of the two compared
always runs second.

Every rate is ``records / (t_last - t_first)`` where ``t_first`` is when the
consumer's first non-empty ``getmany`` returned: the consumer-group join (tansu
answers a JoinGroup only after ``session_timeout_ms / 2``) and the connection set-up
are excluded the same way for all three consumers.  Each consumer fetches with
aiokafka's defaults and ``max_records`` equal to the service's
``STRATAMETER_BATCH_MAX_RECORDS``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import orjson

from .ingest import service_consume
from .records import classifier_ids, produce, score_values
from .result import BenchResult


# --------------------------------------------------------------------------- bare consumer


async def bare_consume(bootstrap: str, topic: str, partitions: int, records: int, decode: bool,
                       max_records: int, timeout_s: float, own: bool = False) -> float:
    """Seconds from the first non-empty fetch to the last record read (and decoded); `own`:
    taking aiokafka's own record objects (`app.records`), as the service's consumer does."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from ..app import records as own_records

    own_records.install()  # for every bare consumer, so each repeat's references read through the same class
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                                auto_offset_reset="earliest",
                                **({"value_deserializer": own_records.own_records} if own else {}))
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        await consumer.seek_to_beginning()
        loads = orjson.loads
        count = 0
        t0 = None
        deadline = time.monotonic() + timeout_s
        while count < records:
            if time.monotonic() > deadline:
                raise TimeoutError(f"bare consumer read {count} of {records} records in {timeout_s:.0f}s")
            batches = await consumer.getmany(timeout_ms=500, max_records=max_records)
            if t0 is None and batches:
                t0 = time.perf_counter()
            for recs in batches.values():
                if decode:
                    for r in recs:
                        loads(r.value)
                count += len(recs)
        return time.perf_counter() - t0
    finally:
        await consumer.stop()


# --------------------------------------------------------------------------- the run


async def run_bench(kafka: str, redis_url: str, records: int = 500_000, classifiers: int = 10,
                    partitions: int = 3, memory_at: list[int] | None = None, seed: int = 0,
                    log: Callable[[str], None] = lambda msg: None, timeout_s: float | None = None,
                    all_metrics: bool = False, redis_cluster: str | None = None, serve: int = 0,
                    serve_load: float = 0.5, repeat: int = 1) -> BenchResult:
    """One benchmark run against the given Kafka bootstrap servers and Redis URL (with
    `all_metrics`, the service's ingest a second time with every metric enabled; with
    `redis_cluster`, the URL of a Redis Cluster node, once more against that cluster; with `serve`
    answers, the whole service over the ingested state on each backend, `serve.serve_bench`, with
    scores streaming at `serve_load` times the measured ingest rate meanwhile).

    Uses fresh topic, consumer group and Redis key prefix names, so it can run
    against shared backends; it does not delete them afterwards.  The measurements in the order
    they run: the records produced, the warm-up, each repeat (`_repeat`), the whole service.
    """
    from ..config import load_settings

    if records < 1 or classifiers < 1 or partitions < 1 or repeat < 1:
        raise ValueError("records, classifiers, partitions and repeat must be >= 1")
    memory_at = [records // 5, records // 2] if memory_at is None else memory_at
    timeout_s = timeout_s if timeout_s is not None else 120 + records / 2000
    names, env = await _fresh_names(kafka, redis_url, partitions)
    cids = classifier_ids(classifiers)
    run = _Run(kafka, names["scores"], partitions, records, cids, load_settings(env).batch_max_records, timeout_s, log)

    produce_s, stream = await _produce(run, seed, keep=bool(serve))
    cluster_env = {**_renamed(env, "-cluster"), "STRATAMETER_REDIS_URL": redis_cluster or "",
                   "STRATAMETER_REDIS_CLUSTER": "true"}
    log("warm-up: the service ingests the topic once, untimed (fresh group and keys)")
    await service_consume(load_settings(_renamed(env, "-warm")), cids, records, [], timeout_s)
    reps = []
    for rep in range(repeat):
        tag = f" (repeat {rep + 1} of {repeat})" if repeat > 1 else ""
        reps.append(await _repeat(run, _fresh(env, rep), memory_at if rep == 0 else [], tag,
                                  all_metrics and rep % 2 == 1,  # alternate: neither compared always runs second
                                  all_metrics, _fresh(cluster_env, rep) if redis_cluster else None))
    rates = [r.rates(records) for r in reps]
    median = {k: float(np.median([r[k] for r in rates])) for k in rates[0]}
    first = reps[0]
    backends = {"redis": env, **({"cluster": cluster_env} if redis_cluster else {})}
    served = await _serve(backends, kafka, names, cids, stream, median["service"] * serve_load, serve, timeout_s,
                          log) if serve else {}
    return BenchResult(
        records=records, classifiers=classifiers, partitions=partitions, batch_max_records=run.max_records,
        service_records_per_s=median["service"], raw_consume_decode_records_per_s=median["decode"],
        raw_consume_records_per_s=median["raw"], raw_consume_decode_own_records_per_s=median["decode_own"],
        service_seconds=records / median["service"], service_join_seconds=first.join_s,
        decode_seconds=records / median["decode"], raw_seconds=records / median["raw"],
        redis_bytes_per_classifier=first.snaps[-1]["bytes_per_classifier"],
        records_counted=min(r.snaps[-1]["records"] for r in reps), produce_seconds=produce_s, memory=first.snaps,
        service_all_metrics_records_per_s=median["all_metrics"] if all_metrics else None,
        redis_bytes_per_classifier_all_metrics=first.every[1] if first.every else None,
        service_cluster_records_per_s=median["cluster"] if redis_cluster else None,
        redis_bytes_per_classifier_cluster=first.cluster[1] if first.cluster else None,
        serve=served or None, repeats=rates, cpu=[r.cpu_seconds() for r in reps],
    )


@dataclass(frozen=True)
class _Run:
    """What every timed read of one run shares."""

    kafka: str
    topic: str
    partitions: int
    records: int
    cids: list[str]
    max_records: int
    timeout_s: float
    log: Callable[[str], None]


@dataclass
class _Repeat:
    """One repeat's timed reads: the bare consumers' and the service's seconds, the service's join
    and memory snapshots and CPU, the every-metric and cluster ingests (`_ingest`, or None)."""

    raw_s: float
    decode_s: float
    own_s: float
    service_s: float
    join_s: float
    snaps: list[dict]
    cpu: dict
    every: tuple[float, int, dict] | None
    cluster: tuple[float, int, dict] | None

    def rates(self, records: int) -> dict[str, float]:
        return {"raw": records / self.raw_s, "decode": records / self.decode_s, "decode_own": records / self.own_s,
                "service": records / self.service_s,
                **({"all_metrics": records / self.every[0]} if self.every else {}),
                **({"cluster": records / self.cluster[0]} if self.cluster else {})}

    def cpu_seconds(self) -> dict:
        return {"service": self.cpu, **({"all_metrics": self.every[2]} if self.every else {}),
                **({"cluster": self.cluster[2]} if self.cluster else {})}


async def _produce(run: _Run, seed: int, keep: bool) -> tuple[float, list[tuple[bytes, bytes]]]:
    """The run's records generated and produced: (seconds to produce them, with `keep` the records
    as (key, value) for `serve.serve_bench` to stream again, else [])."""
    run.log(f"generating {run.records:,} score records for {len(run.cids)} classifiers")
    which, values = score_values(run.records, len(run.cids), seed)
    run.log(f"producing to {run.topic} ({run.partitions} partitions)")
    t0 = time.perf_counter()
    await produce(run.kafka, run.topic, run.partitions, which, values, len(run.cids))
    produce_s = time.perf_counter() - t0
    keys = [c.encode() for c in run.cids]
    return produce_s, [(keys[c], v) for c, v in zip(which.tolist(), values)] if keep else []


async def _fresh_names(kafka: str, redis_url: str, partitions: int) -> tuple[dict[str, str], dict[str, str]]:
    """Fresh topics (created) and the service's settings on them, with a fresh consumer group and
    Redis key prefix: (topic names by role, the ``STRATAMETER_*`` environment)."""
    from ..embedded import create_topics

    run_id = uuid.uuid4().hex[:10]
    names = {k: f"bench-{k}-{run_id}" for k in ("scores", "requests", "labels", "dlq")}
    await create_topics(kafka, [names["scores"]], partitions=partitions)
    await create_topics(kafka, [names["requests"], names["labels"], names["dlq"]], partitions=1)
    return names, {
        "STRATAMETER_KAFKA_BOOTSTRAP_SERVERS": kafka,
        "STRATAMETER_KAFKA_CONSUMER_GROUP": f"bench-{run_id}",
        "STRATAMETER_KAFKA_SESSION_TIMEOUT_MS": "6000",
        "STRATAMETER_REDIS_URL": redis_url,
        "STRATAMETER_REDIS_KEY_PREFIX": f"bench-{run_id}",
        "STRATAMETER_TOPIC_SCORES": names["scores"],
        "STRATAMETER_TOPIC_LABEL_REQUESTS": names["requests"],
        "STRATAMETER_TOPIC_LABELS": names["labels"],
        "STRATAMETER_TOPIC_DEAD_LETTER": names["dlq"],
    }


async def _repeat(run: _Run, env: dict, memory_at: list[int], tag: str, every_first: bool, all_metrics: bool,
                  cluster_env: dict | None) -> _Repeat:
    """One repeat: the three bare consumers, then the service's ingest with the settings `env`
    (memory snapshots at `memory_at`), the every-metric ingest before it (`every_first`) or after
    it, and the ingest on the Redis Cluster (`cluster_env`)."""
    from ..config import load_settings

    bare = (run.kafka, run.topic, run.partitions, run.records)
    run.log("bare consumer, raw (no decoding)" + tag)
    raw_s = await bare_consume(*bare, False, run.max_records, run.timeout_s)
    run.log("bare consumer, orjson.loads per record" + tag)
    decode_s = await bare_consume(*bare, True, run.max_records, run.timeout_s)
    run.log("bare consumer, orjson.loads per record, aiokafka's own record objects" + tag)
    own_s = await bare_consume(*bare, True, run.max_records, run.timeout_s, own=True)
    every = await _every_metric(env, run.cids, run.records, run.timeout_s, run.log) if every_first else None
    run.log("service ingest path (fresh consumer group)" + tag)
    service_s, join_s, snaps, cpu = await service_consume(load_settings(env), run.cids, run.records, memory_at,
                                                          run.timeout_s)
    if all_metrics and not every_first:
        every = await _every_metric(env, run.cids, run.records, run.timeout_s, run.log)
    cluster = await _ingest(cluster_env, run.cids, run.records, run.timeout_s, run.log,
                            "on the Redis Cluster") if cluster_env is not None else None
    return _Repeat(raw_s, decode_s, own_s, service_s, join_s, snaps, cpu, every, cluster)


def _fresh(env: dict, rep: int) -> dict:
    """`env` with the consumer group and key prefix of repeat `rep` (the first keeps its names)."""
    return env if rep == 0 else _renamed(env, f"-r{rep}")


def _renamed(env: dict, suffix: str) -> dict:
    """`env` with `suffix` appended to its consumer group and key prefix: an ingest of its own, which
    reads the topic from the start into keys no other ingest of the run touches."""
    return {**env, "STRATAMETER_KAFKA_CONSUMER_GROUP": env["STRATAMETER_KAFKA_CONSUMER_GROUP"] + suffix,
            "STRATAMETER_REDIS_KEY_PREFIX": env["STRATAMETER_REDIS_KEY_PREFIX"] + suffix}


async def _every_metric(env: dict, cids: list[str], records: int, timeout_s: float, log) -> tuple[float, int, dict]:
    """`_ingest` with every metric enabled (both sides of the threshold kept), on a fresh consumer
    group and key prefix (those of `env` with ``-all``)."""
    every = {**_renamed(env, "-all"), "STRATAMETER_METRICS": "precision,recall,f1,accuracy"}
    return await _ingest(every, cids, records, timeout_s, log, "every metric (both sides of the threshold)")


async def _ingest(env: dict, cids: list[str], records: int, timeout_s: float, log, what: str
                  ) -> tuple[float, int, dict]:
    """One more timed ingest of the service with the settings `env` (a fresh consumer group and key
    prefix), logged as `what`: (seconds, Redis bytes per classifier at the end, CPU seconds as
    `service_consume` gives them)."""
    from ..config import load_settings

    log(f"service ingest path, {what} (fresh group and keys)")
    seconds, _, snaps, cpu = await service_consume(load_settings(env), cids, records, [], timeout_s)
    return seconds, snaps[-1]["bytes_per_classifier"], cpu


async def _serve(backends: dict[str, dict], kafka: str, names: dict[str, str], cids: list[str], stream: list,
                 rate: float, answers: int, timeout_s: float, log) -> dict[str, dict]:
    """`serve.serve_bench` on each backend's state (its settings in `backends`), one after the other."""
    from .serve import serve_bench

    out = {}
    for name, backend_env in backends.items():
        log(f"the whole service on {name}")
        out[name] = await serve_bench(backend_env, kafka, names, cids, stream, rate, answers, timeout_s, log)
    return out


def embedded_backends(stack, kafka: str | None, redis: str | None, log: Callable[[str], None]) -> tuple[str, str]:
    """The Kafka bootstrap servers and Redis URL given, an embedded tansu and Redis (entered on
    `stack`, an `ExitStack`) for those not given."""
    from ..embedded import EmbeddedKafka, EmbeddedRedis

    if kafka is None:
        log("starting embedded Kafka (tansu)")
        kafka = stack.enter_context(EmbeddedKafka()).bootstrap
    if redis is None:
        log("starting embedded Redis")
        redis = stack.enter_context(EmbeddedRedis()).url
    return kafka, redis


def bench(records: int = 500_000, classifiers: int = 10, partitions: int = 3, kafka: str | None = None,
          redis: str | None = None, memory_at: list[int] | None = None, seed: int = 0,
          log: Callable[[str], None] = lambda msg: None, all_metrics: bool = False,
          redis_cluster: bool | str = False, serve: int = 0, serve_load: float = 0.5, repeat: int = 1) -> BenchResult:
    """`run_bench` with embedded tansu / Redis for the backends not given (`redis_cluster`: a
    cluster node's URL, or True for a local three-master cluster)."""
    from contextlib import ExitStack

    from ..embedded import EmbeddedRedisCluster

    with ExitStack() as stack:
        kafka, redis = embedded_backends(stack, kafka, redis, log)
        if redis_cluster is True:
            log("starting a local Redis Cluster (three masters)")
            redis_cluster = stack.enter_context(EmbeddedRedisCluster()).url
        return asyncio.run(run_bench(kafka, redis, records, classifiers, partitions, memory_at, seed, log,
                                     all_metrics=all_metrics, redis_cluster=redis_cluster or None,
                                     serve=serve, serve_load=serve_load, repeat=repeat))
